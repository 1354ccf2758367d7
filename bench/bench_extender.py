"""Scheduler extender benchmarks (not tests): prints what it measures.

Default: server-side latency of filter and prioritize with 5,000 NodeNames
against a cache of 5,000 nodes and ~20 pods each (100,000 pods), i.e. the
whole bytes -> decision -> bytes path of one call (`extender.routes.respond`:
JSON decode, strict parsing, the decision from the in-memory cache, JSON
encode). Budget (DESIGN.md §9): every row (filter and prioritize) p99 <= 5 ms.
Half the nodes form a Pool; one admitted Job carries a plan in it (§10).

    .venv/bin/python bench/bench_extender.py [--nodes 5000] [--pods-per-node 20]

`--sandbox`: kube-scheduler's throughput on the real control plane,
scheduling 2,000 pods on 500 fake nodes with and without the extender
(budget: with >= 50 % of without). Starts its own sandbox in a temporary
directory (or uses `--sandbox-dir` if one runs there) and stops it after.
By default the pods are *managed* (DESIGN §9): Jobs of 10 pods in a
namespace a Queue lists, admitted by the sandbox's arbiter (with a plan,
status.admission, when the loop fits nodes) while kube-scheduler is held;
then kube-scheduler is started and the binding rate measured. With
`--sandbox-unmanaged` they are bare pods in an opted-out namespace (the
extender's fast path).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arbiter.cache.records import (
    NodeRecord,
    PodRecord,
    PoolRecord,
    QueueRecord,
    UnitAdmission,
    UnitRecord,
)
from arbiter.cache.store import KINDS, ClusterStore
from arbiter.core.resources import Resources
from extender import routes
from extender.state import ExtenderState

GIB = 2**30


def build_store(nodes: int, pods_per_node: int) -> tuple[ClusterStore, list[str]]:
    store = ClusterStore()
    store.synced_kinds.update(KINDS)
    store.upsert_pool(PoolRecord(name="big", node_selector=(("pool", "a"),)))
    names = [f"node-{i:05d}" for i in range(nodes)]
    for index, name in enumerate(names):
        labels = (("kubernetes.io/hostname", name), ("pool", "a" if index % 2 else "b"),
                  ("topology.kubernetes.io/zone", f"z{index % 3}"))
        store.upsert_node(NodeRecord(
            name=name, allocatable=Resources({"cpu": 64_000, "memory": 256 * GIB, "pods": 110}),
            ready=True, labels=labels,
        ))
    queues = [f"q{i}" for i in range(20)]
    for queue in queues:
        store.upsert_queue(QueueRecord(
            name=queue, capability=Resources({"cpu": 10_000_000}),
            node_selector=(("pool", "a"),) if queue == "q1" else (),
        ))
    serial = 0
    for index, name in enumerate(names):
        for k in range(pods_per_node):
            serial += 1
            queue = queues[serial % len(queues)]
            store.upsert_pod(PodRecord(
                uid=f"uid-{serial}", namespace="bench", name=f"p-{serial}",
                requests=Resources({"cpu": 500 + 100 * (k % 5), "memory": GIB}),
                node_name=name, phase="Running", queue=queue,
                job_name=f"job-{serial // 8}",
            ))
        if index % 1000 == 0:
            gc.collect()
    for queue in queues[:2]:
        store.units[f"bench/job-new-{queue}"] = UnitRecord(
            uid=f"unit-{queue}", namespace="bench", name=f"job-new-{queue}", queue=queue,
            phase="Dequeued",
        )
    store.units["bench/job-job-7"] = UnitRecord(
        uid="unit-7", namespace="bench", name="job-job-7", queue="q0", phase="Running")
    # A Job of 16 pods admitted into the pool "big" (the odd nodes), planned
    # on 16 of them; 8 of its pods (job-9's above) are bound already.
    planned = tuple(names[min(2 * k + 1, len(names) - 1)] for k in range(16))
    store.units["bench/job-job-9"] = UnitRecord(
        uid="unit-9", namespace="bench", name="job-job-9", queue="q3", phase="Running",
        admission=UnitAdmission("big", (("main", planned),)))
    return store, names


def pod(name: str, queue: str | None, job: str, uid: str,
        namespace: str = "bench") -> dict[str, Any]:
    labels = {"app": "bench"}
    if queue is not None:
        labels["arbiter.dev/queue"] = queue
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {
            "name": name, "namespace": namespace, "uid": uid,
            "creationTimestamp": "2025-01-01T00:00:00Z", "labels": labels,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                 "uid": "job-uid", "controller": True}],
        },
        "spec": {
            "containers": [{"name": "main", "image": "pause",
                            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}],
            "schedulerName": "default-scheduler", "priority": 0,
        },
        "status": {"phase": "Pending"},
    }


def measure(label: str, call: Callable[[], Any], runs: int,
            with_gc: bool = False) -> tuple[float, float]:
    for _ in range(20):
        call()
    samples = []
    if not with_gc:
        gc.disable()
    try:
        for _ in range(runs):
            started = time.perf_counter()
            call()
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        gc.enable()
    samples.sort()
    p50 = statistics.median(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    print(f"  {label:<58} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   max {samples[-1]:6.2f} ms")
    return p50, p99


def latency(nodes: int, pods_per_node: int, runs: int, with_gc: bool) -> bool:
    started = time.perf_counter()
    store, names = build_store(nodes, pods_per_node)
    state = ExtenderState(store)
    print(f"cache: {len(store.nodes)} nodes, {len(store.pods)} pods "
          f"(built in {time.perf_counter() - started:.1f} s)")
    print(f"server-side time per call, {len(names)} NodeNames, {runs} runs each, "
          f"garbage collector {'on' if with_gc else 'off'}:")

    def body(queue: str | None, job: str) -> bytes:
        # Unmanaged means an unmanaged namespace (an unlabelled pod in a
        # managed one is checked, as the webhook would check it).
        namespace = "bench" if queue is not None else "kube-system"
        return orjson.dumps({"Pod": pod("bench-pod", queue, job, "bench-uid", namespace),
                             "Nodes": None, "NodeNames": names})

    cases = [
        ("filter", "filter: managed pod, admitted, within capability", body("q0", "new-q0")),
        ("filter", "filter: managed pod, queue nodeSelector (half match)", body("q1", "new-q1")),
        ("filter", "filter: managed pod, planned unit (its pool: half)", body("q3", "job-9")),
        ("filter", "filter: managed pod, not admitted (all fail)", body("q2", "nope")),
        ("filter", "filter: unmanaged pod", body(None, "x")),
        ("prioritize", "prioritize: managed gang pod (locality + packing)", body("q0", "job-7")),
        ("prioritize", "prioritize: planned gang pod (plan + locality + packing)",
         body("q3", "job-9")),
        ("prioritize", "prioritize: unmanaged pod", body(None, "x")),
    ]
    print(f"  (request body: {len(cases[0][2]) / 1024:.0f} KiB)")
    worst = 0.0
    for verb, label, payload in cases:
        reply = routes.respond(verb, state, payload)
        assert reply.status == 200, reply.body[:200]
        def call(verb: str = verb, payload: bytes = payload) -> routes.Reply:
            return routes.respond(verb, state, payload)

        _, p99 = measure(label, call, runs, with_gc)
        worst = max(worst, p99)
    ok = worst <= 5.0
    print(f"budget: every row p99 <= 5 ms -> worst {worst:.2f} ms: {'OK' if ok else 'OVER'}")
    return ok


# -- sandbox throughput ---------------------------------------------------------------
def _pod_list(namespace: str, count: int, prefix: str) -> dict[str, Any]:
    items = [{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{prefix}-{i}", "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "pause",
                                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
    } for i in range(count)]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _job_list(namespace: str, queue: str, pods: int, per_job: int) -> dict[str, Any]:
    from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION

    labels = {"arbiter.dev/queue": queue}
    items = [{
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"j-{i}", "namespace": namespace, "labels": labels},
        "spec": {
            "parallelism": min(per_job, pods - i * per_job),
            "completions": min(per_job, pods - i * per_job), "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels,
                             "annotations": {POD_COMPLETE_DELAY_ANNOTATION: "30m"}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main", "image": "pause",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
            },
        },
    } for i in range((pods + per_job - 1) // per_job)]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _pod_count(sandbox: Any, namespace: str) -> int:
    listed = sandbox.api_get(f"/api/v1/namespaces/{namespace}/pods?limit=1")
    return len(listed["items"]) + int(listed["metadata"].get("remainingItemCount") or 0)


def _create_managed(sandbox: Any, namespace: str, pods: int) -> str:
    """A Queue listing `namespace`, Jobs of 10 pods in it; wait until arbiter has
    admitted them all (every pod exists, Pending). Says whether units carry plans."""
    queue = namespace
    sandbox.apply_yaml(orjson.dumps({
        "apiVersion": "arbiter.dev/v1alpha1", "kind": "Queue", "metadata": {"name": queue},
        "spec": {"weight": 1, "namespaces": [namespace]}}).decode())
    time.sleep(1.0)  # the webhook's cache sees the Queue
    manifest = sandbox.dir / f"{namespace}.json"
    manifest.write_bytes(orjson.dumps(_job_list(namespace, queue, pods, 10)))
    # Every Job passes the webhook: slow on a loaded machine, so a long timeout.
    sandbox.kubectl("create", "-f", str(manifest), "-o", "name", timeout=600)
    deadline = time.monotonic() + 600
    while _pod_count(sandbox, namespace) < pods:
        if time.monotonic() > deadline:
            have = _pod_count(sandbox, namespace)
            raise SystemExit(f"arbiter admitted only {have} of {pods} pods in 10 minutes")
        time.sleep(1.0)
    units = sandbox.api_get(
        f"/apis/arbiter.dev/v1alpha1/namespaces/{namespace}/queueunits?limit=1")["items"]
    admission = (units[0].get("status") or {}).get("admission") if units else None
    return f"admitted with plans (pool {admission['pool']})" if admission else "admitted, no plans"


def _api(sandbox: Any) -> tuple[str, int, Any]:
    from arbiter.sandbox.probe import verified_context

    keys = sandbox.pki
    context = verified_context(keys.ca_cert, keys.client_cert("admin"), keys.client_key("admin"))
    host, _, port = sandbox.apiserver_url.removeprefix("https://").rpartition(":")
    return host, int(port), context


def _list_version(sandbox: Any, namespace: str) -> str:
    listed = sandbox.api_get(f"/api/v1/namespaces/{namespace}/pods?limit=1")
    return str(listed["metadata"]["resourceVersion"])


def _bound_times(sandbox: Any, namespace: str, count: int, version: str,
                 timeout: float) -> list[float]:
    """Watch the namespace's pods from `version` on; when each got a nodeName."""
    import http.client

    host, port, context = _api(sandbox)
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < count and time.monotonic() < deadline:
        connection = http.client.HTTPSConnection(host, port, context=context, timeout=30)
        try:
            connection.request(
                "GET", f"/api/v1/namespaces/{namespace}/pods?watch=1&resourceVersion={version}")
            response = connection.getresponse()
            while len(seen) < count:
                line = response.readline()
                if not line:
                    break  # the apiserver ended the watch: resume from `version`
                event = orjson.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    version = _list_version(sandbox, namespace)
                    break
                version = obj["metadata"]["resourceVersion"]
                name = obj["metadata"]["name"]
                if obj["spec"].get("nodeName") and name not in seen:
                    seen[name] = time.monotonic()
        except TimeoutError:
            break  # nothing happened for 30 s
        finally:
            connection.close()
    return sorted(seen.values())


def _filter_calls(sandbox: Any) -> float:
    from arbiter.sandbox.probe import http_get, verified_context

    context = verified_context(sandbox.arbiter_cert_dir / "ca.crt")
    status, body = http_get(sandbox.arbiter_url() + "/metrics", context)
    if status != 200:
        raise SystemExit(f"arbiter's /metrics answered {status}")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("arbiter_extender_requests_total{") and 'verb="filter"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def throughput(sandbox: Any, original: dict[str, Any], with_extender: bool, pods: int,
               managed: bool) -> float:
    import copy

    from arbiter.sandbox import process

    namespace = f"bench-{'ext' if with_extender else 'plain'}-{int(time.time())}"
    document = copy.deepcopy(original)
    if not with_extender:
        document.pop("extenders", None)
    assert ("extenders" in document) == with_extender
    calls_before = _filter_calls(sandbox)
    sandbox.kubectl("create", "namespace", namespace)
    # Hold scheduling while the pods are created (and admitted), so that
    # creation and admission speed do not limit what is measured.
    process.stop(sandbox.processes()["kube-scheduler"])
    if managed:
        kind = _create_managed(sandbox, namespace, pods)
    else:
        kind = "unmanaged"
        sandbox.kubectl("label", "namespace", namespace, "arbiter.dev/managed=false")
        manifest = sandbox.dir / f"{namespace}.json"
        manifest.write_bytes(orjson.dumps(_pod_list(namespace, pods, "p")))
        sandbox.kubectl("create", "-f", str(manifest), "-o", "name", timeout=600)
    import threading

    version = _list_version(sandbox, namespace)
    times: list[float] = []
    watcher = threading.Thread(
        target=lambda: times.extend(_bound_times(sandbox, namespace, pods, version, 600)))
    watcher.start()
    sandbox.restart_scheduler(document)
    watcher.join()
    calls = _filter_calls(sandbox) - calls_before
    # Gone before the next run starts: deleting 2,000 pods (and arbiter
    # following it) must not slow whichever run comes next.
    sandbox.kubectl("delete", "namespace", namespace, "--timeout=600s", timeout=620)
    if managed:
        sandbox.kubectl("delete", "queue", namespace, "--wait=false", check=False)
    if with_extender and calls < pods:
        print(f"  warning: the extender's filter was called {calls:.0f} times for {pods} pods")
    if len(times) < pods:
        print(f"  only {len(times)} of {pods} pods were bound")
    span = times[-1] - times[0] if len(times) > 1 else float("inf")
    rate = (len(times) - 1) / span if span > 0 else 0.0
    print(f"  {'with' if with_extender else 'without'} extender: {len(times)} pods ({kind}) "
          f"bound in {span:.2f} s -> {rate:.0f} pods/s (extender filter calls: {calls:.0f})")
    return rate


def sandbox_benchmark(directory: str | None, nodes: int, pods: int, rounds: int,
                      managed: bool) -> bool:
    import tempfile

    from arbiter.sandbox import NodeShape, Sandbox

    own = directory is None
    where = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="arbiter-bench-"))
    sandbox = Sandbox(where, quiet=True)
    try:
        if own or not sandbox.healthy():
            print(f"starting a sandbox with {nodes} nodes in {where} ...")
            sandbox.up(NodeShape(count=nodes, cpu="8", memory="32Gi"), arbiter=True)
        original = sandbox.scheduler_config()
        if "extenders" not in original:
            raise SystemExit("the sandbox's kube-scheduler has no extender configured")
        print(f"kube-scheduler throughput, {pods} pods on {nodes} fake nodes, "
              f"{rounds} round(s) alternating (the median of each counts):")
        without_runs: list[float] = []
        with_runs: list[float] = []
        for index in range(rounds):
            # Alternate which goes first, so neither always runs on a warmer cluster.
            for extender in (index % 2 == 1, index % 2 == 0):
                runs = with_runs if extender else without_runs
                runs.append(throughput(sandbox, original, extender, pods, managed))
        sandbox.restart_scheduler(original)
        without = statistics.median(without_runs)
        with_extender = statistics.median(with_runs)
        ratio = with_extender / without if without else 0.0
        ok = ratio >= 0.5
        print(f"without extender {without:.0f} pods/s, with {with_extender:.0f} pods/s; "
              f"budget: with >= 50 % of without -> {ratio:.0%}: {'OK' if ok else 'UNDER'}")
        return ok
    finally:
        if own:
            sandbox.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=int, default=20)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--with-gc", action="store_true",
                        help="leave Python's cyclic garbage collector on while timing")
    parser.add_argument("--sandbox", action="store_true",
                        help="also run the sandbox throughput benchmark")
    parser.add_argument("--sandbox-only", action="store_true")
    parser.add_argument("--sandbox-dir", default=None)
    parser.add_argument("--sandbox-nodes", type=int, default=500)
    parser.add_argument("--sandbox-pods", type=int, default=2000)
    parser.add_argument("--sandbox-rounds", type=int, default=1)
    parser.add_argument("--sandbox-unmanaged", action="store_true",
                        help="bare pods in an opted-out namespace instead of admitted Jobs")
    args = parser.parse_args(argv)
    ok = True
    if not args.sandbox_only:
        ok = latency(args.nodes, args.pods_per_node, args.runs, args.with_gc)
    if args.sandbox or args.sandbox_only:
        ok = sandbox_benchmark(args.sandbox_dir, args.sandbox_nodes, args.sandbox_pods,
                               args.sandbox_rounds, not args.sandbox_unmanaged) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
