"""Benchmark: the admission loop.

Offline (default): a store holding 100 queues, 500 nodes × 8 CPU and
100,000 gated one-CPU pods with their QueueUnits (Enqueued), an
AdmissionController over the in-memory API. Printed:

1. the cold cycle (a new leader: index, engine and 100,000 units built from
   the cache, then `admit_all`) — the 4,000 admissions it decides are
   spawned as write tasks, not waited for;
2. carrying those writes out against the in-memory API (status + ungate);
3. the incremental cycle: one admitted pod finishes, the loop releases it
   and admits the next unit (p50 / p99 over many);
4. one status round (metrics, Queue status, 96,000 positions computed).

On the sandbox (`--sandbox DIR`, a running `arbiter sandbox up --dir DIR`):
2,000 Jobs across 20 queues, each requesting 1m CPU and finishing a second
after it starts (kwok); prints Job creation → admission (unsuspend seen by a
watch) latency p50 / p99 and admissions per second, and where that time
goes, stage by stage, from watch events on Jobs and QueueUnits: the
creation call (arbiter's webhook inside it), the QueueUnit appearing, its
status turning Dequeued (admission decided and written), the Job
unsuspended. A stage ends when this client's watch sees it, so it also
holds the watch's delivery lag: on a saturated apiserver the Job watch
(which carries every Job status update too) lagged arbiter's unsuspend
PATCH response by p90 2.2 s / p99 4.7 s at 27 Jobs/s — the seconds the
"unsuspend" stage showed were mostly that, not arbiter's (`--dump` gives
per-Job times to join with another process's monotonic timestamps).

    .venv/bin/python bench/bench_loop.py [--units 100000] [--sandbox DIR --jobs 2000]
        [--rate 27 --in-flight 64]   # paced creation (otherwise: as fast as 16 at once go)
        [--dump FILE]                # each Job's stage times, as JSON
        [--compare-admit-on-create]  # arbiter restarted with the fast path off, then on
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arbiter.base.kubeapi import pod_path, queue_path, unit_path
from arbiter.cache.store import KINDS, ClusterStore
from arbiter.core.api import ADMISSION_GATE, QUEUE_LABEL, format_rfc3339
from arbiter.loop.controller import AdmissionController
from arbiter.loop.settings import LoopSettings
from arbiter.loop.standby import WarmStandby
from arbiter.testing.memory import InMemoryApi
from bench.watching import pct

QUEUES = 100
NODES = 500
NODE_CPU = 8
T0 = 1_700_000_000.0


class EncodedObjects(MutableMapping[str, dict[str, Any]]):
    """The in-memory API's objects kept as orjson bytes: the fake apiserver
    lives in this process, and 200,000 objects as dicts (~1.7 KiB each)
    would be counted in arbiter's peak RSS although a real apiserver holds
    them in another process. Read back whole on every access (the
    in-memory API writes every change back whole)."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    def __getitem__(self, key: str) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(self._data[key])
        return value

    def __setitem__(self, key: str, value: dict[str, Any]) -> None:
        # Copied: orjson's bytes keep its whole output buffer (4 KiB) allocated.
        self._data[key] = memoryview(orjson.dumps(value)).tobytes()

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data


def raw_pod_and_unit(index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    queue = f"queue-{index % QUEUES:03d}"
    namespace = f"ns-{index % QUEUES:03d}"
    name = f"p-{index:06d}"
    uid = f"uid-{index}"
    created = format_rfc3339(T0 + index / 100)
    pod = {
        "metadata": {"name": name, "namespace": namespace, "uid": uid,
                     "creationTimestamp": created, "labels": {QUEUE_LABEL: queue},
                     "resourceVersion": "1"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                 "schedulingGates": [{"name": ADMISSION_GATE}], "priority": index % 7},
        "status": {"phase": "Pending"},
    }
    unit = {
        "metadata": {"name": f"pod-{name}", "namespace": namespace,
                     "uid": f"unit-{index}", "creationTimestamp": created,
                     "resourceVersion": "1"},
        "spec": {"queue": queue, "priority": index % 7,
                 "consumerRef": {"kind": "Pod", "name": name, "uid": uid},
                 "podSets": [{"name": "main", "count": 1, "requests": {"cpu": "1"}}]},
    }
    return pod, unit


def build(units: int, encoded: bool = True) -> tuple[ClusterStore, InMemoryApi]:
    """The store as a watch fills it, object by object (each raw object
    decoded, converted and dropped, as arbiter's watches do), and the
    in-memory API holding the same objects (encoded unless `encoded` is
    False: then as dicts, as before, counted in this process's RSS)."""
    store = ClusterStore()
    api = InMemoryApi(store, objects=EncodedObjects() if encoded else None)
    store.replace_all("Node", [
        {"metadata": {"name": f"node-{n}"},
         "status": {"allocatable": {"cpu": str(NODE_CPU), "memory": "64Gi"},
                    "conditions": [{"type": "Ready", "status": "True"}]}}
        for n in range(NODES)])
    queues = [
        {"metadata": {"name": f"queue-{q:03d}"},
         "spec": {"weight": 1 + q % 3, "guarantee": {"cpu": "4"} if q % 10 == 0 else {},
                  "queuePolicy": "FIFO" if q % 2 else "Priority"}}
        for q in range(QUEUES)]
    store.replace_all("Queue", queues)
    for name in store.queues:
        api.objects[queue_path(name)] = {
            "metadata": {"name": name, "resourceVersion": "1"}, "spec": {}}
    for index in range(units):
        pod, unit = raw_pod_and_unit(index)
        if encoded:  # what a watch hands the store: freshly decoded objects
            pod, unit = orjson.loads(orjson.dumps(pod)), orjson.loads(orjson.dumps(unit))
        store.apply("Pod", "ADDED", pod)
        store.apply("QueueUnit", "ADDED", unit)
        meta = pod["metadata"]
        api.objects[pod_path(meta["namespace"], meta["name"])] = pod
        meta = unit["metadata"]
        api.objects[unit_path(meta["namespace"], meta["name"])] = unit
    store.synced_kinds.update(KINDS)
    return store, api


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def api_mib(api: InMemoryApi) -> float:
    """What the in-memory API's objects take (encoded: the bytes and the
    dict's slots; as dicts: a deep estimate)."""
    objects = api.objects
    if isinstance(objects, EncodedObjects):
        data = objects._data
        return (sys.getsizeof(data) + sum(sys.getsizeof(k) + sys.getsizeof(v)
                                          for k, v in data.items())) / 2**20
    return (sys.getsizeof(objects) + sum(
        sys.getsizeof(k) + _deep_size(v) for k, v in objects.items())) / 2**20


def _deep_size(value: Any) -> int:
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(_deep_size(k) + _deep_size(v) for k, v in value.items())
    elif isinstance(value, list):
        size += sum(_deep_size(v) for v in value)
    return size


async def offline(units: int, freeze: bool, encoded: bool = True) -> None:
    started = time.perf_counter()
    store, api = build(units, encoded)
    if freeze:
        # What a long-running server may do after its first sync: move the
        # cache out of the cyclic collector's way (records hold no cycles).
        gc.collect()
        gc.freeze()
    print(f"setup: {units:,} pods + units, {QUEUES} queues, {NODES} nodes × {NODE_CPU} CPU "
          f"({time.perf_counter() - started:.1f}s); RSS now {rss_mib():.0f} MiB, of which the "
          f"in-memory API's objects (the bench's, not arbiter's) ~{api_mib(api):.0f} MiB")

    clock_now = [T0 + units]
    controller = AdmissionController(store, api, LoopSettings(debounce=0.0),
                                     clock=lambda: clock_now[0])
    controller.start_listening()

    # A new leader: the index in slices, then cycles of `batch` keys each
    # until every unit is classified; only then the first admissions.
    t = time.perf_counter()
    await controller.resync(reindex=True)
    slices: list[float] = []
    chosen: list[Any] = []
    while True:
        s = time.perf_counter()
        chosen = controller.cycle(controller.settings.batch)
        slices.append(time.perf_counter() - s)
        if chosen:
            break
        await asyncio.sleep(0)  # (the in-memory API never yields: writes wait for this)
    cold = time.perf_counter() - t
    print(f"new leader, {units:,} units: first admissions after {cold * 1000:.0f} ms "
          f"({len(slices)} cycles of ≤ {controller.settings.batch} keys: longest "
          f"{max(slices[:-1]) * 1000:.1f} ms, p50 {statistics.median(slices) * 1000:.1f} ms; "
          f"the admitting one {slices[-1] * 1000:.0f} ms for {len(chosen):,} admissions)")

    t = time.perf_counter()
    await controller.writes.wait()
    writes = time.perf_counter() - t
    print(f"carrying out {len(chosen):,} admissions (status + ungate, in-memory API): "
          f"{writes:.2f}s ({len(chosen) / writes:,.0f}/s)")
    t = time.perf_counter()
    controller.cycle()  # the watch events of those writes
    print(f"cycle absorbing their {len(chosen) * 2:,} watch events: "
          f"{(time.perf_counter() - t) * 1000:.0f} ms")

    durations = []
    admitted = [u.key for u in chosen]
    for index in range(300):
        namespace, name = admitted[index].split("/")
        pod_name = name.removeprefix("pod-")
        api.set_status(f"/api/v1/namespaces/{namespace}/pods/{pod_name}",
                       {"phase": "Succeeded"})
        t = time.perf_counter()
        got = controller.cycle()
        durations.append(time.perf_counter() - t)
        assert len(got) == 1, got
        await controller.writes.wait()
        controller.cycle()
    print(f"incremental cycle (one finishes, next admitted): "
          f"p50 {statistics.median(durations) * 1000:.2f} ms, "
          f"p99 {pct(durations, 0.99) * 1000:.2f} ms")

    t = time.perf_counter()
    waiting = controller.mirror.waiting_by_queue()
    await controller.publisher.publish()
    status_round = time.perf_counter() - t
    spawned = controller.writes.running()
    print(f"status round ({sum(len(v) for v in waiting.values()):,} waiting, "
          f"{QUEUES} queues): {status_round * 1000:.0f} ms ({spawned:,} writes spawned)")
    await controller.close()
    controller.stop_listening()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {rss:.0f} MiB (the in-memory API's raw objects included)")
    await warm_takeover(store, api, admitted[300:400], clock_now)


async def warm_takeover(store: ClusterStore, api: InMemoryApi, finishing: list[str],
                        clock_now: list[float]) -> None:
    """A standby kept warm (arbiter.loop.standby) takes over: the leader is
    gone, 100 of its pods finish meanwhile, the standby's engine has them;
    time from taking the Lease to the new controller's first admissions."""
    standby = WarmStandby(store, 1.0)
    t = time.perf_counter()
    standby.start()
    while not (standby.follow.indexed and not standby.follow.pending()):  # noqa: ASYNC110
        await asyncio.sleep(0.01)  # (polled: the standby has no "caught up" event)
    print(f"standby warm-up (index + engine from the cache, in slices): "
          f"{time.perf_counter() - t:.2f}s")
    for key in finishing:
        namespace, name = key.split("/")
        api.set_status(f"/api/v1/namespaces/{namespace}/pods/{name.removeprefix('pod-')}",
                       {"phase": "Succeeded"})
    await asyncio.sleep(0.2)  # the standby applies those changes
    t, cpu = time.perf_counter(), time.process_time()
    follow = await standby.take()
    controller = AdmissionController(store, api, LoopSettings(debounce=0.0),
                                     clock=lambda: clock_now[0], follow=follow)
    controller.start_listening()
    assert controller.warm, "the standby handed over no index"
    # As AdmissionController.run starts a warm leader: a cycle, then the resync.
    controller.warming = False
    chosen: list[Any] = controller.cycle(controller.settings.batch)
    first = (time.perf_counter(), time.process_time())
    await controller.resync()
    while not chosen:
        chosen = controller.cycle(controller.settings.batch)
        first = (time.perf_counter(), time.process_time())
        await asyncio.sleep(0)
    print(f"warm takeover: first admissions {(first[0] - t) * 1000:.0f} ms after "
          f"taking the Lease, {(first[1] - cpu) * 1000:.0f} ms of CPU "
          f"({len(chosen)} admitted; budget 2 s); then queueing everything for a look: "
          f"{(time.perf_counter() - first[0]) * 1000:.0f} ms")
    await controller.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS with a standby's engine too: {rss:.0f} MiB")


# -- sandbox ---------------------------------------------------------------------------------


class StageTimes:
    """When each Job passed each stage, as this process saw it (monotonic clock)."""

    STAGES = (
        ("webhook + create (POST round trip)", "sent", "created"),
        ("QueueUnit creation (Job created → unit ADDED)", "created", "unit"),
        ("admission decision + status write (unit ADDED → Dequeued)", "unit", "dequeued"),
        ("unsuspend (Dequeued → Job suspend=false)", "dequeued", "released"),
        ("total: creation → admission", "sent", "released"),
        ("after: creation → a pod ready (Job status, or done)", "sent", "running"),
    )

    def __init__(self) -> None:
        self.at: dict[str, dict[str, float]] = {
            "sent": {}, "created": {}, "unit": {}, "dequeued": {}, "released": {},
            "running": {}}
        self.done = asyncio.Event()
        self.expected = 0

    def on_job(self, kind: str, job: dict[str, Any], now: float) -> None:
        meta = job["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        status = job.get("status") or {}
        if key in self.at["sent"] and (status.get("ready") or status.get("succeeded")):
            self.at["running"].setdefault(key, now)
        if key in self.at["sent"] and job.get("spec", {}).get("suspend") is False:
            released = self.at["released"]
            released.setdefault(key, now)
            if len(released) >= self.expected:
                self.done.set()

    def on_unit(self, kind: str, unit: dict[str, Any], now: float) -> None:
        consumer = unit.get("spec", {}).get("consumerRef") or {}
        key = f"{unit['metadata']['namespace']}/{consumer.get('name', '')}"
        self.at["unit"].setdefault(key, now)
        if (unit.get("status") or {}).get("phase") == "Dequeued":
            self.at["dequeued"].setdefault(key, now)

    def report(self) -> list[str]:
        lines = []
        for label, start, end in self.STAGES:
            first, last = self.at[start], self.at[end]
            spans = [last[k] - first[k] for k in last if k in first]
            lines.append(f"  {label:<62} p50 {pct(spans, 0.5) * 1000:6.0f} ms  "
                         f"p99 {pct(spans, 0.99) * 1000:6.0f} ms  ({len(spans)})")
        return lines


def request_counts(directory: Path) -> tuple[float, float]:
    """(arbiter's own API requests, every request the apiserver served) so far."""
    import ssl

    from arbiter.sandbox import Sandbox
    from arbiter.sandbox.probe import http_get

    sandbox = Sandbox(directory, quiet=True)
    context = ssl.create_default_context(cafile=str(sandbox.arbiter_cert_dir / "ca.crt"))
    _, body = http_get(sandbox.arbiter_metrics_url() + "/metrics", context)
    own = sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
              if line.startswith("arbiter_api_requests_total{"))
    served = sum(float(line.rsplit(" ", 1)[1])
                 for line in sandbox.kubectl("get", "--raw", "/metrics").stdout.splitlines()
                 if line.startswith("apiserver_request_total{"))
    return own, served


async def settled_counts(directory: Path, quiet: float = 8.0,
                         limit: float = 240.0) -> tuple[float, float]:
    """`request_counts` once arbiter's own count has grown by less than one
    request a second (its Lease renewals) for `quiet` seconds, or after `limit`."""
    deadline = time.monotonic() + limit
    mark = await asyncio.to_thread(request_counts, directory)
    since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(2.0)
        now = await asyncio.to_thread(request_counts, directory)
        if now[0] - mark[0] > time.monotonic() - since:
            mark, since = now, time.monotonic()  # still writing
        elif time.monotonic() - since >= quiet:
            return now
    return await asyncio.to_thread(request_counts, directory)


def restart_arbiter(directory: Path, args: list[str]) -> None:
    """The sandbox's arbiter again with `args`, once it leads (Jobs created
    before that are all held, whatever the flag)."""
    import ssl

    from arbiter.sandbox import Sandbox
    from arbiter.sandbox.probe import http_get

    sandbox = Sandbox(directory, quiet=True)
    sandbox.stop_arbiter()
    sandbox.start_arbiter(args)
    context = ssl.create_default_context(cafile=str(sandbox.arbiter_cert_dir / "ca.crt"))
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        _, body = http_get(sandbox.arbiter_metrics_url() + "/metrics", context)
        if b"\narbiter_leader 1.0" in body:
            break
        time.sleep(0.5)
    time.sleep(2.0)  # the new leader's engine warms before Jobs arrive


async def on_sandbox(directory: Path, jobs: int, queues: int, in_flight: int,
                     rate: float | None = None, dump: Path | None = None,
                     label: str = "") -> None:
    from kubernetes_asyncio import config as kube_config

    from arbiter.base.kubeapi import ApiError, request_json
    from bench.watching import Watches

    client = await kube_config.new_client_from_config(
        config_file=str(directory / "kubeconfig"), persist_config=False)
    run = uuid.uuid4().hex[:5]
    names = [f"bench-{run}-{q:02d}" for q in range(queues)]
    async with client:
        for name in names:
            await request_json(client, "POST", "/api/v1/namespaces",
                               body={"metadata": {"name": name}})
            await request_json(client, "POST", "/apis/arbiter.dev/v1alpha1/queues",
                               body={"apiVersion": "arbiter.dev/v1alpha1", "kind": "Queue",
                                     "metadata": {"name": name},
                                     "spec": {"namespaces": [name]}})
        await asyncio.sleep(1.0)  # the webhook's cache learns the queues
        stages = StageTimes()
        stages.expected = jobs
        watches = Watches(client)
        await watches.add("/apis/batch/v1/jobs", stages.on_job, QUEUE_LABEL)
        await watches.add("/apis/arbiter.dev/v1alpha1/queueunits", stages.on_unit)
        semaphore = asyncio.Semaphore(in_flight)
        failures: list[str] = []
        own_before, served_before = await asyncio.to_thread(request_counts, directory)

        async def create(index: int) -> None:
            namespace = names[index % queues]
            name = f"j{index:05d}"
            body = {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"template": {
                    "metadata": {"annotations": {
                        "pod-complete.stage.kwok.x-k8s.io/delay": "1s"}},
                    "spec": {"restartPolicy": "Never", "containers": [{
                        "name": "c", "image": "x",
                        "resources": {"requests": {"cpu": "1m"}}}]}}},
            }
            key = f"{namespace}/{name}"
            if rate:  # paced: Job `index` is sent at its time, not when a slot frees
                await asyncio.sleep(max(0.0, started + index / rate - time.monotonic()))
            async with semaphore:
                stages.at["sent"][key] = time.monotonic()
                try:
                    reply = await request_json(
                        client, "POST", f"/apis/batch/v1/namespaces/{namespace}/jobs",
                        body=body)
                except ApiError as error:
                    del stages.at["sent"][key]
                    stages.expected -= 1
                    failures.append(str(error)[:200])
                    return
                now = time.monotonic()
                stages.at["created"][key] = now
                if (reply.get("spec") or {}).get("suspend") is False:
                    # Admitted at creation (DESIGN §16): its own POST says so.
                    stages.on_job("ADDED", reply, now)

        started = time.monotonic()
        await asyncio.gather(*(create(i) for i in range(jobs)))
        created = time.monotonic()
        if failures:
            print(f"{len(failures)} creations failed, e.g. {failures[0]}")
        try:
            await asyncio.wait_for(stages.done.wait(), 600)
        except TimeoutError:
            print(f"only {len(stages.at['released'])} of {stages.expected} Jobs seen "
                  "unsuspended within 600 s; the figures below cover those")
        finally:
            await watches.close()
        # Every Job's whole life is counted: its unit's writes go on after
        # admission (Running, Succeed), and lag on a loaded apiserver.
        own_after, served_after = await settled_counts(directory)
        sent, seen = stages.at["sent"], stages.at["released"]
        latencies = [seen[k] - sent[k] for k in seen]
        posts = [stages.at["created"][k] - sent[k] for k in stages.at["created"] if k in sent]
        last = max(seen.values())
        pacing = f"paced at {rate:g}/s, at most {in_flight}" if rate else str(in_flight)
        print(f"{label}sandbox: {jobs:,} Jobs in {queues} queues created in "
              f"{created - started:.1f}s "
              f"({jobs / (created - started):.1f}/s, {pacing} in flight); "
              f"creation → admission p50 {pct(latencies, 0.5) * 1000:.0f} ms, "
              f"p99 {pct(latencies, 0.99) * 1000:.0f} ms; "
              f"{len(seen) / (last - started):.0f} admissions/s")
        print(f"{label}the Job POST itself: p50 {pct(posts, 0.5) * 1000:.0f} ms, "
              f"p99 {pct(posts, 0.99) * 1000:.0f} ms; API requests per admitted Job: "
              f"arbiter's own {(own_after - own_before) / max(1, len(seen)):.2f}, the "
              f"apiserver's in all {(served_after - served_before) / max(1, len(seen)):.1f}")
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(f"this client (creations and watches) used {usage.ru_utime + usage.ru_stime:.0f} "
              "CPU-s; its watch timestamps lag when it gets too little CPU")
        print("per stage, as watches saw it:")
        print("\n".join(stages.report()))
        if dump is not None:
            # Per Job and stage, this host's monotonic clock (comparable with
            # other processes' time.monotonic(), e.g. a trace of arbiter's).
            await asyncio.to_thread(dump.write_text, json.dumps(stages.at))
        await cleanup(client, names)


async def cleanup(client: Any, names: list[str]) -> None:
    """Namespaces first (their units go with them), then the queues, which
    may only be deleted once nothing admitted is left in them (given up
    after a minute: a loaded sandbox empties namespaces slowly)."""
    from arbiter.base.kubeapi import ApiError, request_json

    for name in names:
        await request_json(client, "DELETE", f"/api/v1/namespaces/{name}")
    deadline = time.monotonic() + 60.0
    for name in names:
        while time.monotonic() < deadline:
            try:
                await request_json(client, "DELETE",
                                   f"/apis/arbiter.dev/v1alpha1/queues/{name}")
                break
            except ApiError as error:
                if error.status == 404:
                    break
                await asyncio.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--sandbox", type=Path, help="a running sandbox's directory")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--in-flight", type=int, default=16,
                        help="Job creations at once on the sandbox (default 16)")
    parser.add_argument("--rate", type=float, default=None,
                        help="send Job creations at this rate (per second) instead of as "
                             "fast as --in-flight allows")
    parser.add_argument("--dump", type=Path,
                        help="write each Job's stage times (monotonic clock) as JSON here")
    parser.add_argument("--dict-objects", action="store_true",
                        help="the in-memory API keeps its objects as dicts (counted in the "
                             "peak RSS; the default keeps them encoded)")
    parser.add_argument("--compare-admit-on-create", action="store_true",
                        help="on the sandbox: run with arbiter restarted "
                             "--admit-on-create=false, then again with it on (DESIGN §16)")
    parser.add_argument("--no-freeze", action="store_true",
                        help="leave the 100,000 records in the cyclic GC's generations")
    args = parser.parse_args(argv)
    if args.sandbox is not None and args.compare_admit_on_create:
        for flag in ("false", "true"):
            restart_arbiter(args.sandbox, [f"--admit-on-create={flag}"])
            asyncio.run(on_sandbox(args.sandbox, args.jobs, args.queues, args.in_flight,
                                   args.rate, None, f"[admit-on-create={flag}] "))
    elif args.sandbox is not None:
        asyncio.run(on_sandbox(args.sandbox, args.jobs, args.queues, args.in_flight,
                               args.rate, args.dump))
    else:
        asyncio.run(offline(args.units, not args.no_freeze, not args.dict_objects))
    print(json.dumps({"done": True}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
