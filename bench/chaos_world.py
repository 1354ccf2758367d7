"""What a chaos run creates, all from one seed: the tenants (20 Queues with
mixed weights, guarantees and capabilities, a parent with children, and a
Pool some queues are confined to), the Jobs and when each arrives, the
fault schedule, and the final wave that fills the cluster so that deserved
shares can be compared with the offline engine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION

GROUP = "arbiter.dev/v1alpha1"
PARENT = "org"
POOL = "fast"
POOL_LABEL = "chaos.arbiter.dev/pool"
TENANTS = 20
CHILDREN = 4  # t00..t03 are the parent's children
POOLED = ("t04", "t05")  # may use the fast pool only


@dataclass(frozen=True, slots=True)
class Shape:
    nodes: int
    node_cpu: int
    node_memory_gi: int
    jobs: int
    arrival_seconds: float
    run_seconds: tuple[int, int]  # what a Job's pods run for, drawn per Job
    max_pods: int = 8  # a Job has 1..max_pods pods


@dataclass(frozen=True, slots=True)
class Fault:
    at: float  # seconds after the first Job
    kind: str  # leader-kill | follower-kill | apiserver-restart | etcd-stop | proxy-cut


def ns_of(tenant: str) -> str:
    return f"chaos-{tenant}"


def tenant_names() -> list[str]:
    return [f"t{i:02d}" for i in range(TENANTS)]


def queues(shape: Shape) -> list[dict[str, Any]]:
    """The parent first (children name it), then the 20 tenants."""
    total = shape.nodes * shape.node_cpu

    def cpu(fraction: float) -> str:
        return str(max(1, int(total * fraction)))

    out = [_queue(PARENT, {"weight": 2, "capability": {"cpu": cpu(0.2)},
                           "guarantee": {"cpu": cpu(0.05)}})]
    for i, name in enumerate(tenant_names()):
        spec: dict[str, Any] = {"weight": 1 + i % 4, "namespaces": [ns_of(name)]}
        if i % 5 == 2:
            spec["guarantee"] = {"cpu": cpu(0.03), "memory": f"{max(1, int(total * 0.03))}Gi"}
        if i % 3 == 1:
            spec["capability"] = {"cpu": cpu(0.06)}
        if i < CHILDREN:
            spec["parent"] = PARENT
        if name in POOLED:
            spec["pools"] = [POOL]
        out.append(_queue(name, spec))
    return out


def _queue(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": GROUP, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def setup_objects(shape: Shape) -> list[dict[str, Any]]:
    """Namespaces, the Pool and the Queues, in an order `kubectl create` takes."""
    pool = {"apiVersion": GROUP, "kind": "Pool", "metadata": {"name": POOL},
            "spec": {"nodeSelector": {POOL_LABEL: POOL}}}
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns_of(t)}}
                  for t in tenant_names()]
    return [*namespaces, pool, *queues(shape)]


def pool_nodes(shape: Shape) -> list[str]:
    """The nodes labelled into the Pool: every tenth."""
    return [f"kwok-node-{i}" for i in range(0, shape.nodes, 10)]


def job(name: str, ns: str, pods: int, cpu: str, memory: str, runs_for: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {
                         "metadata": {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: runs_for}},
                         "spec": {"restartPolicy": "Never", "containers": [{
                             "name": "main", "image": "busybox",
                             "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}}}


def pod_count(rng: random.Random, most: int) -> int:
    """1..`most` pods, P(n) proportional to 1/n² (most batch Jobs are small:
    with 8, 66 % have one pod, 1 % eight; 1.8 pods a Job on average). A
    uniform mix (4.5 a Job, 45,000 pods for 10,000 Jobs) is ~75 pods/s
    over ten minutes, past what this two-core machine's Job controller,
    scheduler and apiserver can create, bind and finish at all: every
    admission then timed out behind the backlog."""
    weights = [1.0 / (n * n) for n in range(1, most + 1)]
    return rng.choices(range(1, most + 1), weights)[0]


def arrivals(shape: Shape, seed: int) -> list[tuple[float, dict[str, Any]]]:
    """(seconds after the start, Job) for every Job, in arrival order."""
    rng = random.Random(seed)
    tenants = tenant_names()
    out = []
    for index in range(shape.jobs):
        tenant = rng.choice(tenants)
        pods = pod_count(rng, shape.max_pods)
        cpu = rng.choice(["250m", "500m", "1", "2"])
        memory = rng.choice(["256Mi", "512Mi", "1Gi", "2Gi"])
        runs_for = f"{rng.randint(*shape.run_seconds)}s"
        at = shape.arrival_seconds * index / max(1, shape.jobs)
        out.append((at, job(f"j{index:05d}", ns_of(tenant), pods, cpu, memory, runs_for)))
    return out


def wave(shape: Shape) -> list[dict[str, Any]]:
    """One Job per tenant, each pod a whole node's CPU, a quarter of the
    cluster's nodes: more than any queue can deserve (weight 4 of 42 at the
    top, ~10 % of the cluster) or reclaim would make room for, so the wave
    is demand only, and each queue's deserved share no longer moves with
    the run's own Jobs ending while the shares are compared. One Job each,
    so the wave's units appear soon even behind a leader's backlog of
    writes. tests/sandbox/test_chaos_parts.py checks the margin."""
    pods = -(-shape.nodes // 4)
    return [job("wave", ns_of(tenant), pods, str(shape.node_cpu), "1Gi", "30m")
            for tenant in tenant_names()]


def fault_plan(seed: int, *, first: float, gap: tuple[float, float], leader_kills: int,
               others: list[str]) -> list[Fault]:
    """Leader kills `gap` seconds apart (drawn) from `first`; each other
    fault halfway between two kills (or after the last), in seeded places."""
    rng = random.Random(seed ^ 0x5EED)
    kills, at = [], first
    for _ in range(leader_kills):
        kills.append(at)
        at += rng.uniform(*gap)
    # Between two kills when there are two; else after the (only) one.
    slots = list(range(max(1, len(kills) - 1)))
    rng.shuffle(slots)
    plan = [Fault(t, "leader-kill") for t in kills]
    for i, kind in enumerate(others):
        slot = slots[i % len(slots)] if slots else 0
        start = kills[slot] if kills else first
        end = kills[slot + 1] if slot + 1 < len(kills) else start + sum(gap)
        # Late in the gap: the takeover after the kill (a Lease duration) is over.
        plan.append(Fault(start + (end - start) * rng.uniform(0.55, 0.65), kind))
    return sorted(plan, key=lambda fault: fault.at)


def offline_scenario(capacity: dict[str, str], queue_objs: list[dict[str, Any]],
                     demand: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """An `arbiter fairshare` document: the queues as they are, and what
    each still has to run (pod sets of its units not ended)."""
    queues_doc = []
    for obj in queue_objs:
        spec = obj.get("spec") or {}
        entry: dict[str, Any] = {"name": obj["metadata"]["name"],
                                 "weight": int(spec.get("weight") or 1)}
        for key in ("guarantee", "capability", "parent"):
            if spec.get(key):
                entry[key] = spec[key]
        entry["units"] = [{"count": 1, "pods": int(ps.get("count") or 0),
                           "requests": dict(ps.get("requests") or {})}
                          for ps in demand.get(entry["name"], []) if ps.get("count")]
        queues_doc.append(entry)
    return {"capacity": capacity, "queues": queues_doc}
