"""JobSet queued whole (issue 28, DESIGN §14) on the real JobSet controller:
one unit per JobSet (`jobset-<name>`, a pod set per replicatedJob), held by
`spec.suspend` until all of it fits, placed into its pool, re-suspended
whole by reclaim, and charged as a Job of the same size.

On the `integrated` sandbox (8 fake nodes x 1 CPU); the primary arbiter
runs with a short reclaim grace for this module.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    create,
    get,
    hold_cluster,
    let_go,
    metrics,
    suffix,
    tenant,
    units,
    wait_for,
)
from tests.e2e.workloads import (
    CPUS,
    NODES,
    allocated_cpu,
    consumer,
    consumer_ref,
    job_of,
    jobset,
    phase,
    pod_sets,
    pods,
    pool,
    quiet,
    running,
    set_room,
    suspended,
    unit,
)

pytestmark = pytest.mark.usefixtures("short_grace")
POOL_NODES = NODES[-4:]


def children(sandbox: Sandbox, ns: str, name: str) -> list[dict[str, Any]]:
    return pods(sandbox, ns, f"jobset.sigs.k8s.io/jobset-name={name}")


def completed(sandbox: Sandbox, ns: str, name: str) -> bool:
    status = get(sandbox, "jobset", name, "-n", ns).get("status") or {}
    return any(c["type"] == "Completed" and c["status"] == "True"
               for c in status.get("conditions") or [])


def test_a_jobset_waits_whole_runs_whole_in_its_pool_and_frees_its_quota(
        integrated: Sandbox) -> None:
    sb = integrated
    quiet(sb)
    with pool(sb, POOL_NODES) as (pool_name, selector), \
            tenant(sb, "js", wait=60, capability={"cpu": "3"}, pools=[pool_name]) as (ns, q):
        create(sb, jobset("train", ns, runs_for="15s"))
        created = get(sb, "jobset", "train", "-n", ns)
        assert created["spec"]["suspend"] is True  # held at the door
        queued = wait_for("the JobSet's unit", lambda: unit(sb, ns, "jobset-train"))
        assert consumer_ref(queued) == consumer(created)
        assert pod_sets(queued) == {"driver": 1, "workers": 3}
        # One unit for the whole JobSet: its child Jobs have none.
        time.sleep(3)  # time enough to admit it (wrongly) or to queue a child
        assert [u["metadata"]["name"] for u in units(sb, ns)] == ["jobset-train"]
        assert phase(unit(sb, ns, "jobset-train")) == "Enqueued"
        assert suspended(sb, ns, "jobset", "train")
        assert pods(sb, ns) == []  # not one child pod while 4 CPUs do not fit in 3
        assert allocated_cpu(sb, q) == "0"

        set_room(sb, ns, q, 4, pools=[pool_name])
        wait_for("all 4 child pods Running", lambda: len(running(sb, ns)) == 4, timeout=60)
        for child in children(sb, ns, "train"):
            assert selector.items() <= (child["spec"].get("nodeSelector") or {}).items(), child
            assert child["spec"]["nodeName"] in POOL_NODES
        assert allocated_cpu(sb, q) == "4"

        wait_for("the JobSet Completed", lambda: completed(sb, ns, "train"), timeout=60)
        wait_for("its unit Succeed", lambda: phase(unit(sb, ns, "jobset-train")) == "Succeed",
                 timeout=30)
        wait_for("its 4 CPUs freed", lambda: allocated_cpu(sb, q) == "0", timeout=30)


def test_reclaim_suspends_the_jobset_whole_and_it_runs_again_whole(integrated: Sandbox) -> None:
    sb = integrated
    quiet(sb)
    with tenant(sb, "jsr", wait=60) as (ns, q), \
            tenant(sb, "jobr", wait=60, guarantee={"cpu": str(CPUS)}) as (other_ns, _):
        create(sb, jobset("train", ns))
        wait_for("the JobSet's 4 pods Running", lambda: len(running(sb, ns)) == 4, timeout=60)
        before = metrics(sb).get(
            ("arbiter_preempted_units_total", (("queue", q), ("reason", "reclaim"))), 0.0)
        # Under its guarantee, the other queue's 6-CPU Job reclaims the
        # JobSet (4 of the 8 CPUs; 4 are free).
        create(sb, job_of("batch", other_ns, 6, runs_for="10s"))
        wait_for("the JobSet suspended again", lambda: suspended(sb, ns, "jobset", "train"),
                 timeout=60)
        wait_for("its pods gone", lambda: children(sb, ns, "train") == [], timeout=60)
        assert phase(unit(sb, ns, "jobset-train")) == "Enqueued"  # requeued, not Failed
        assert metrics(sb)[("arbiter_preempted_units_total",
                            (("queue", q), ("reason", "reclaim")))] == before + 1
        wait_for("the Job's 6 pods Running", lambda: len(running(sb, other_ns)) == 6,
                 timeout=60)
        wait_for("the JobSet running again whole", lambda: len(running(sb, ns)) == 4,
                 timeout=90)
        assert not suspended(sb, ns, "jobset", "train")
        assert phase(unit(sb, ns, "jobset-train")) in ("Dequeued", "Running")


def test_a_jobset_is_charged_as_a_job_of_the_same_size(integrated: Sandbox) -> None:
    """Two queues of equal weight on 8 CPUs, one with JobSets (1 + 3 CPUs),
    one with Jobs of 4 CPUs: DRF gives each queue one, as it would two
    queues of Jobs."""
    sb = integrated
    quiet(sb)
    tag = suffix()
    with tenant(sb, f"hold-{tag}") as (hold_ns, hold_q), \
            tenant(sb, f"jsq-{tag}", wait=60) as (js_ns, js_q), \
            tenant(sb, f"jobq-{tag}", wait=60) as (job_ns, job_q):
        hold_cluster(sb, hold_ns, hold_q, CPUS)
        create(sb, jobset("a", js_ns), jobset("b", js_ns),
               job_of("a", job_ns, 4), job_of("b", job_ns, 4))
        wait_for("4 units", lambda: len(units(sb, js_ns)) + len(units(sb, job_ns)) == 4)
        let_go(sb, hold_ns)
        wait_for("8 pods Running", lambda: len(running(sb, js_ns)) + len(running(sb, job_ns))
                 == CPUS, timeout=60)
        time.sleep(2)  # nothing more is admitted
        assert len(running(sb, js_ns)) == len(running(sb, job_ns)) == 4
        assert allocated_cpu(sb, js_q) == allocated_cpu(sb, job_q) == "4"
        admitted = {ns: sorted(u["metadata"]["name"] for u in units(sb, ns)
                               if phase(u) in ("Dequeued", "Running"))
                    for ns in (js_ns, job_ns)}
        assert [len(names) for names in admitted.values()] == [1, 1], admitted

        def shares() -> list[Any] | None:
            got = list((get(sb, "queue", name).get("status") or {}).get("dominantShare")
                        for name in (js_q, job_q))
            return got if None not in got else None

        assert wait_for("both queues' status", shares, timeout=30) == [0.5, 0.5]
