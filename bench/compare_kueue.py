"""kube-arbiter against Kueue on one sandbox: the same workload through each in turn.

    .venv/bin/python bench/compare_kueue.py [--jobs 2000] [--tenants 10] [--nodes 4]

One sandbox (`arbiter sandbox up`, as tests/e2e use) with Kueue's CRDs and
manager (`bench/kueue_run.py`, built by `arbiter sandbox build --with kueue`).
kube-arbiter runs first; its namespaces are then deleted, it is stopped and
kube-scheduler restarted without its extender, and Kueue runs the same
workload on fresh namespaces. Everything started is stopped by pid at the end,
also on failure.

Object mapping (a fair fight: each system as its documentation recommends
for weighted fair sharing of one pool of nodes):

| kube-arbiter                        | Kueue v1beta2                                          |
|-------------------------------------|--------------------------------------------------------|
| (the cluster's nodes)               | one ResourceFlavor (no labels: every node)             |
| (cluster capacity, shared)          | one Cohort of all the ClusterQueues (borrowing and     |
|                                     |   lending without limits)                              |
| Queue per tenant, `spec.namespaces` | ClusterQueue per tenant (cohortName, nominalQuota =    |
|   = [its namespace]                 |   capacity × weight / Σ weights, its weighted-DRF      |
|                                     |   share) + LocalQueue in the tenant's namespace; Jobs  |
|                                     |   carry its queue-name label                           |
| Queue `spec.weight`                 | ClusterQueue `spec.fairSharing.weight`                 |
| reclaim (default grace 30 s)        | Configuration `fairSharing` (preemption strategies     |
|                                     |   LessThanOrEqualToFinalShare, LessThanInitialShare),  |
|                                     |   `preemption: reclaimWithinCohort: Any,               |
|                                     |   withinClusterQueue: LowerPriority`                   |
| webhook suspends the Job            | its Job webhook suspends the Job                       |
| QueueUnit admitted, Job unsuspended | Workload admitted, Job unsuspended                     |

Measured, all from watch events seen by this process (monotonic clock):

- throughput: `--jobs` Jobs of one 10m-CPU pod that KWOK completes after 1 s,
  round-robin over `--tenants` tenants of weight 1, created 16 at a time;
  admitted = the Job's `spec.suspend` seen false. Jobs admitted per second
  (first creation to last admission), creation→admission p50/p99, makespan
  (first creation to last Job complete).
- fairness: three tenants, weights 3:2:1, each flooding the cluster with as
  many 1-CPU Jobs as the cluster has CPUs (they run for 10 minutes), arriving
  `--stagger` seconds apart. Every 0.5 s each tenant's dominant share (its
  pods bound to a node and not finished, over the cluster's CPUs) against the
  weighted-DRF share (capacity × weight / total weight). Time to fair: from
  the last arrival to the first sample with every tenant within one Job of
  its share; max deviation: the largest distance (in Jobs) after that;
  preemptions: Jobs suspended again after they were admitted.
- cost: peak RSS (VmHWM) and CPU seconds of each controller process; the
  apiserver requests (`apiserver_request_total` on its /metrics)
  the apiserver served while each system ran, all clients together (both are
  in system:masters, so API priority and fairness cannot tell them apart; the
  workload is the same, so the difference is what the controller causes) and
  on the controller's own API group, and the apiserver's CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arbiter.base.kubeapi import ApiError, open_stream, request_json
from arbiter.core.api import MANAGED_LABEL
from arbiter.sandbox import NodeShape, Sandbox
from arbiter.sandbox.kueue import ensure_kueue_built
from arbiter.sandbox.process import ProcessRecord
from bench.compare_report import add_write_doc, print_table, table, write_doc
from bench.kueue_run import CONCURRENCY, KueueProcess
from bench.watching import Watches, pct

RUN_LABEL = "bench.arbiter.dev/run"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
THROUGHPUT_CPU = "10m"
DELAY_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"
Json = dict[str, Any]


# ---- the two systems ------------------------------------------------------------------------


class Arbiter:
    name = "kube-arbiter"

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.namespace_labels: dict[str, str] = {}
        self.job_labels: dict[str, str] = {}
        self.queues: list[str] = []

    @property
    def record(self) -> ProcessRecord:
        return self.sandbox.processes()["arbiter"]

    async def make_tenants(self, client: Any, tenants: list[tuple[str, int]],
                           capacity_milli: int) -> None:
        for namespace, weight in tenants:
            await request_json(client, "POST", "/apis/arbiter.dev/v1alpha1/queues", body={
                "apiVersion": "arbiter.dev/v1alpha1", "kind": "Queue",
                "metadata": {"name": namespace},
                "spec": {"namespaces": [namespace], "weight": weight}})
            self.queues.append(namespace)
        await asyncio.sleep(1.0)  # the webhook's cache learns the queues


class Kueue:
    name = "Kueue"
    flavor = "bench-nodes"

    def __init__(self, runner: KueueProcess) -> None:
        self.runner = runner
        self.namespace_labels = {MANAGED_LABEL: "false"}  # arbiter's webhooks keep out
        self.job_labels = {KUEUE_QUEUE_LABEL: "bench"}
        self.cohorts = 0

    @property
    def record(self) -> ProcessRecord:
        assert self.runner.record is not None
        return self.runner.record

    async def make_tenants(self, client: Any, tenants: list[tuple[str, int]],
                           capacity_milli: int) -> None:
        if self.cohorts == 0:
            await request_json(client, "POST", f"{KUEUE_API}/resourceflavors", body={
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": self.flavor}, "spec": {}})
        self.cohorts += 1
        cohort = f"bench-{self.cohorts}"

        def quota(milli: int) -> list[Json]:
            return [{"coveredResources": ["cpu"], "flavors": [{
                "name": self.flavor, "resources": [{"name": "cpu", "nominalQuota": f"{milli}m"}]}]}]

        await request_json(client, "POST", f"{KUEUE_API}/cohorts", body={
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Cohort",
            "metadata": {"name": cohort}, "spec": {}})
        for (namespace, weight), nominal in zip(tenants, nominal_quotas(tenants, capacity_milli),
                                                strict=True):
            await request_json(client, "POST", f"{KUEUE_API}/clusterqueues", body={
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                "metadata": {"name": namespace},
                "spec": {"cohortName": cohort, "namespaceSelector": {},
                         "resourceGroups": quota(nominal), "fairSharing": {"weight": str(weight)},
                         "preemption": {"reclaimWithinCohort": "Any",
                                        "withinClusterQueue": "LowerPriority"}}})
            await request_json(client, "POST", f"{KUEUE_API}/namespaces/{namespace}/localqueues",
                               body={"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                     "metadata": {"name": "bench", "namespace": namespace},
                                     "spec": {"clusterQueue": namespace}})
        await asyncio.sleep(1.0)  # its caches learn the queues


System = Arbiter | Kueue


def nominal_quotas(tenants: list[tuple[str, int]], capacity_milli: int) -> list[int]:
    """Each ClusterQueue's nominal CPU (milli): the capacity split by weight
    (the weighted-DRF share of one resource), the rounding remainder to the
    first, so the quotas add up to the capacity exactly.

    Not all quota in the Cohort and none in the ClusterQueues (the first
    comparison's setup): then every admission borrows, and Kueue's scheduler
    admits at most one borrowing workload per cohort in a scheduling cycle.
    With nominal quota a workload within it does not borrow; borrowing
    beyond nominal, fair sharing and reclaim work as before. (Measured: it
    did not raise Kueue's admission rate here, 2.8/s against 3.4/s;
    docs/against-kueue.md, "Kueue's throughput", says what is left.)"""
    total = sum(weight for _, weight in tenants)
    quotas = [capacity_milli * weight // total for _, weight in tenants]
    quotas[0] += capacity_milli - sum(quotas)
    return quotas


# ---- what the watches see -------------------------------------------------------------------


class Observed:
    """Per Job: sent, first admitted (unsuspended), completed, times preempted;
    per namespace: the pods bound to a node and not finished."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.admitted: dict[str, float] = {}
        self.completed: dict[str, float] = {}
        self.running_jobs: set[str] = set()
        self.preemptions = 0
        self.active_pods: dict[str, set[str]] = {}
        self.changed = asyncio.Event()

    def on_job(self, kind: str, job: Json, now: float) -> None:
        meta = job["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        suspended = job.get("spec", {}).get("suspend", False)
        if not suspended:
            self.admitted.setdefault(key, now)
            self.running_jobs.add(key)
        elif key in self.running_jobs:
            self.running_jobs.discard(key)
            self.preemptions += 1
        if job.get("status", {}).get("succeeded", 0) >= 1:
            self.completed.setdefault(key, now)
        self.changed.set()

    def on_pod(self, kind: str, pod: Json, now: float) -> None:
        meta = pod["metadata"]
        active = self.active_pods.setdefault(meta["namespace"], set())
        bound = bool(pod.get("spec", {}).get("nodeName"))
        finished = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if kind == "DELETED" or not bound or finished or meta.get("deletionTimestamp"):
            active.discard(meta["name"])
        else:
            active.add(meta["name"])

    async def wait_for(self, predicate: Any, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 1.0))
        return True


def job_body(system: System, namespace: str, name: str, cpu: str, delay: str, run: str) -> Json:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {RUN_LABEL: run, **system.job_labels}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {RUN_LABEL: run},
                         "annotations": {DELAY_ANNOTATION: delay}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "x",
                                     "resources": {"requests": {"cpu": cpu}}}]}}},
    }


async def create_jobs(client: Any, system: System, seen: Observed, jobs: list[tuple[str, str]],
                      cpu: str, delay: str, run: str, in_flight: int = 16) -> float:
    """Create (namespace, name) Jobs, `in_flight` at a time; the seconds it took."""
    semaphore = asyncio.Semaphore(in_flight)
    started = time.monotonic()

    async def create(namespace: str, name: str) -> None:
        async with semaphore:
            seen.sent[f"{namespace}/{name}"] = time.monotonic()
            await request_json(client, "POST", f"/apis/batch/v1/namespaces/{namespace}/jobs",
                               body=job_body(system, namespace, name, cpu, delay, run))

    await asyncio.gather(*(create(ns, name) for ns, name in jobs))
    return time.monotonic() - started


async def make_namespaces(client: Any, system: System, names: list[str]) -> None:
    for name in names:
        await request_json(client, "POST", "/api/v1/namespaces", body={
            "metadata": {"name": name, "labels": dict(system.namespace_labels)}})


# ---- the workloads --------------------------------------------------------------------------


async def throughput(client: Any, system: System, seen: Observed, args: argparse.Namespace,
                     run: str, capacity_milli: int) -> Json:
    tenants = [(f"{run}-tp-{t:02d}", 1) for t in range(args.tenants)]
    await make_namespaces(client, system, [ns for ns, _ in tenants])
    await system.make_tenants(client, tenants, capacity_milli)
    jobs = [(tenants[i % len(tenants)][0], f"j{i:05d}") for i in range(args.jobs)]
    keys = [f"{ns}/{name}" for ns, name in jobs]
    creating = await create_jobs(client, system, seen, jobs, THROUGHPUT_CPU, "1s", run)
    await seen.wait_for(lambda: all(k in seen.completed for k in keys), args.timeout)
    first = min(seen.sent[k] for k in keys)
    admitted = [k for k in keys if k in seen.admitted]
    waits = [seen.admitted[k] - seen.sent[k] for k in admitted]
    last_admitted = max((seen.admitted[k] for k in admitted), default=first)
    done = [seen.completed[k] for k in keys if k in seen.completed]
    # What is left must not spill into the fairness run (a backlog still
    # being admitted there would compete for the same nodes).
    await delete_namespaces(client, [ns for ns, _ in tenants])
    return {
        "jobs": len(keys), "admitted": len(admitted), "completed": len(done),
        "created_per_s": len(keys) / creating,
        "admitted_per_s": len(admitted) / max(last_admitted - first, 1e-9),
        "wait_p50": pct(waits, 0.5), "wait_p99": pct(waits, 0.99),
        "makespan": (max(done) - first) if len(done) == len(keys) else float("nan"),
    }


def weighted_shares(capacity: int, weights: list[int]) -> list[float]:
    """Weighted DRF with every tenant demanding more than the cluster: capacity by weight."""
    return [capacity * w / sum(weights) for w in weights]


async def fairness(client: Any, system: System, seen: Observed, args: argparse.Namespace,
                   run: str, capacity_milli: int) -> Json:
    weights = [3, 2, 1]
    tenants = [(f"{run}-fair-{chr(97 + t)}", w) for t, w in enumerate(weights)]
    names = [ns for ns, _ in tenants]
    await make_namespaces(client, system, names)
    await system.make_tenants(client, tenants, capacity_milli)
    slots = capacity_milli // 1000
    target = weighted_shares(slots, weights)
    samples: list[tuple[float, list[int]]] = []
    arrived = time.monotonic()

    async def sample(until: float) -> None:
        while time.monotonic() < until:
            counts = [len(seen.active_pods.get(ns, ())) for ns in names]
            samples.append((time.monotonic(), counts))
            await asyncio.sleep(0.5)

    for index, namespace in enumerate(names):
        jobs = [(namespace, f"f{i:04d}") for i in range(slots)]
        await create_jobs(client, system, seen, jobs, "1", "10m", run)
        arrived = time.monotonic()
        if index < len(names) - 1:
            await sample(arrived + args.stagger)
    fair_at: float | None = None
    deadline = arrived + args.fair_timeout
    while time.monotonic() < deadline:
        await sample(time.monotonic() + 0.5)
        now, counts = samples[-1]
        within = all(abs(c - t) <= 1.0 for c, t in zip(counts, target, strict=True))
        if within and fair_at is None:
            fair_at = now
        if fair_at is not None and now - fair_at >= args.settle:
            break
    after = [s for s in samples if fair_at is not None and s[0] >= fair_at]
    deviation = max((abs(c - t) for _, counts in after
                     for c, t in zip(counts, target, strict=True)), default=float("nan"))
    final = samples[-1][1]
    return {
        "target": [round(t, 2) for t in target], "final": final,
        "time_to_fair": (fair_at - arrived) if fair_at is not None else float("nan"),
        "max_deviation": deviation, "preemptions": seen.preemptions,
        "timeline": [(round(t - samples[0][0], 1), c) for t, c in samples],
    }


# ---- cost -----------------------------------------------------------------------------------


def proc_status(pid: int, field: str) -> int:
    """A `kB` field of /proc/PID/status, in bytes (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def apiserver_metrics(client: Any) -> dict[str, float]:
    """Requests the apiserver served, in total ("*") and per API group, from its /metrics."""
    response = await open_stream(client, "GET", "/metrics")
    try:
        text = (await response.read()).decode()
    finally:
        response.release()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            group = line.split('group="', 1)[1].split('"', 1)[0] if 'group="' in line else ""
            value = float(line.rsplit(" ", 1)[1])
            counts["*"] = counts.get("*", 0.0) + value
            counts[group] = counts.get(group, 0.0) + value
    return counts


# ---- one system, then both ------------------------------------------------------------------


async def run_system(sandbox: Sandbox, system: System, group: str,
                     args: argparse.Namespace) -> Json:
    from kubernetes_asyncio import config as kube_config

    capacity_milli = args.nodes * int(float(args.node_cpu) * 1000)
    run = f"{'ka' if isinstance(system, Arbiter) else 'kq'}-{uuid.uuid4().hex[:4]}"
    client = await kube_config.new_client_from_config(config_file=str(sandbox.kubeconfig),
                                                      persist_config=False)
    apiserver_pid = sandbox.processes()["kube-apiserver"].pid
    async with client:
        seen = Observed()
        watches = Watches(client)
        await watches.add("/apis/batch/v1/jobs", seen.on_job, f"{RUN_LABEL}")
        await watches.add("/api/v1/pods", seen.on_pod, f"{RUN_LABEL}")
        before = await apiserver_metrics(client)
        cpu_before = cpu_seconds(system.record.pid), cpu_seconds(apiserver_pid)
        result: Json = {"system": system.name}
        try:
            if "throughput" in args.phases:
                print(f"[compare] {system.name}: throughput, {args.jobs} Jobs", file=sys.stderr)
                result["throughput"] = await throughput(client, system, seen, args, run,
                                                        capacity_milli)
            if "fairness" in args.phases:
                print(f"[compare] {system.name}: fairness 3:2:1", file=sys.stderr)
                seen.preemptions = 0
                result["fairness"] = await fairness(client, system, seen, args, run,
                                                    capacity_milli)
        finally:
            await watches.close()
        after = await apiserver_metrics(client)
        result["cost"] = {
            "peak_rss": proc_status(system.record.pid, "VmHWM"),
            "cpu_s": cpu_seconds(system.record.pid) - cpu_before[0],
            "apiserver_cpu_s": cpu_seconds(apiserver_pid) - cpu_before[1],
            "requests_own_group": after.get(group, 0) - before.get(group, 0),
            "requests_all": after.get("*", 0) - before.get("*", 0),
        }
        if isinstance(system, Arbiter):
            await remove_arbiter_work(client, system)
    return result


async def delete_namespaces(client: Any, names: list[str], seconds: float = 180.0) -> None:
    """Delete them and wait until they are gone (or `seconds` passed)."""
    for name in names:
        with contextlib.suppress(ApiError):
            await request_json(client, "DELETE", f"/api/v1/namespaces/{name}")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        listed = await request_json(client, "GET", "/api/v1/namespaces")
        if not any(n["metadata"]["name"] in names for n in listed.get("items", [])):
            return
        await asyncio.sleep(0.5)


async def remove_arbiter_work(client: Any, system: Arbiter) -> None:
    """Its namespaces, gone, before Kueue starts, so Kueue's caches start as
    empty as arbiter's did; then its Queues (a Queue with admitted units left
    is refused: arbiter is stopped next anyway)."""
    await delete_namespaces(client, system.queues)
    for name in system.queues:
        with contextlib.suppress(ApiError):
            await request_json(client, "DELETE", f"/apis/arbiter.dev/v1alpha1/queues/{name}")


def versions(sandbox: Sandbox, kueue_version: str) -> Json:
    def out(*cmd: str) -> str:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return result.stdout.strip()

    server = sandbox.api_get("/version")
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "?")
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs ({model}), "
                   f"load {os.getloadavg()[0]:.1f} at start",
        "kubernetes": server.get("gitVersion", "?"), "kueue": kueue_version,
        "kube-arbiter": out("git", "-C", str(Path(__file__).parents[1]), "rev-parse",
                            "--short", "HEAD"),
    }


def attempt(name: str, run: Callable[[], Json]) -> Json:
    """One system's run; a failure is reported in its column, not lost with the other's."""
    try:
        return run()
    except Exception as error:
        traceback.print_exc()
        return {"system": name, "error": f"{type(error).__name__}: {error}"[:300]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--node-cpu", default="8")
    parser.add_argument("--stagger", type=float, default=10.0,
                        help="seconds between the fairness tenants' arrivals")
    parser.add_argument("--fair-timeout", type=float, default=90.0,
                        help="seconds after the last arrival to wait for the fair share")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds watched after the fair share is first reached")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds each system gets to finish the throughput run; one "
                             "that has not is reported with lower bounds (>), so the whole "
                             "comparison stays under 20 minutes")
    parser.add_argument("--kueue-job-concurrency", type=int, default=CONCURRENCY["Job.batch"],
                        help="workers of Kueue's Job reconciler (its Configuration's "
                             "controller.groupKindConcurrency[Job.batch]; default: as shipped)")
    parser.add_argument("--dir", type=Path, help="sandbox directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--systems", default="arbiter,kueue",
                        help="which to run, comma-separated (default both; one: for debugging)")
    parser.add_argument("--phases", default="throughput,fairness",
                        help="which workloads, comma-separated (default both)")
    add_write_doc(parser)
    args = parser.parse_args(argv)
    args.phases = set(args.phases.split(","))
    systems = set(args.systems.split(","))
    kueue_build = ensure_kueue_built() if "kueue" in systems else None
    directory = args.dir or Path(tempfile.mkdtemp(prefix="compare-kueue-"))
    sandbox = Sandbox(directory)
    runner = KueueProcess(sandbox, kueue_build, job_concurrency=args.kueue_job_concurrency) \
        if kueue_build is not None else None
    results: list[Json] = []
    try:
        sandbox.up(NodeShape(count=args.nodes, cpu=args.node_cpu, memory="64Gi"))
        info = versions(sandbox, kueue_build.version if kueue_build is not None else "-")
        if runner is not None:
            runner.install_crds()
        if "arbiter" in systems:
            results.append(attempt("kube-arbiter", lambda: asyncio.run(
                run_system(sandbox, Arbiter(sandbox), "arbiter.dev", args))))
        if runner is not None:
            def kueue() -> Json:
                assert runner is not None
                sandbox.stop_arbiter()
                scheduler = sandbox.scheduler_config()
                scheduler.pop("extenders", None)
                sandbox.restart_scheduler(scheduler)
                runner.start()
                return asyncio.run(run_system(sandbox, Kueue(runner), "kueue.x-k8s.io", args))

            results.append(attempt("Kueue", kueue))
    finally:
        if runner is not None:
            runner.stop()
        sandbox.down()
    print_table(info, results, args)
    if args.write_doc is not None:
        write_doc(table(info, results, args), args.write_doc)
    if args.json is not None:
        info["args"] = {k: str(v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"info": info, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
