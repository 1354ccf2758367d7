"""Kubeflow Trainer v2 TrainJob queued whole (issue 29, DESIGN §14) on the
real Trainer controller and its `torch-distributed` runtime: one unit
(`trainjob-<name>`) whose pod sets are read from the JobSet Trainer makes,
held by `spec.suspend` until all of it fits, then placed into its pool
through arbiter's `spec.runtimePatches` entry and unsuspended; Trainer's
JobSet, its Jobs and pods get no unit of their own.

On the `integrated` sandbox (8 fake nodes x 1 CPU); the primary arbiter
runs with a short reclaim grace for this module.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from arbiter.integrations.trainjob import MANAGER
from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, Sandbox
from tests.e2e.helpers import create, get, tenant, units, wait_for
from tests.e2e.workloads import (
    LONG,
    NODES,
    allocated_cpu,
    consumer,
    consumer_ref,
    job_of,
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
# The tenant's own runtime patch: its pods run until the test ends (kwok).
TENANT_MANAGER = "e2e.arbiter.dev/tenant"


def trainjob(name: str, ns: str, nodes: int) -> dict[str, Any]:
    """`nodes` training nodes of 1 CPU on the torch-distributed runtime."""
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"runtimeRef": {"name": "torch-distributed"},
                     "trainer": {"numNodes": nodes,
                                 "resourcesPerNode": {"requests": {"cpu": "1"}}},
                     "runtimePatches": [{"manager": TENANT_MANAGER, "trainingRuntimeSpec": {
                         "template": {"spec": {"replicatedJobs": [{
                             "name": "node", "template": {"spec": {"template": {"metadata": {
                                 "annotations": {POD_COMPLETE_DELAY_ANNOTATION: LONG}}}}}}]}}}}]}}


def test_a_trainjob_is_one_unit_that_waits_whole_and_runs_whole_in_its_pool(
        integrated: Sandbox) -> None:
    sb = integrated
    quiet(sb)
    with pool(sb, POOL_NODES) as (pool_name, selector), \
            tenant(sb, "tj", wait=60, capability={"cpu": "1"}, pools=[pool_name]) as (ns, q):
        create(sb, trainjob("tune", ns, 2))
        created = get(sb, "trainjob", "tune", "-n", ns)
        assert created["spec"]["suspend"] is True  # held at the door
        queued = wait_for("the TrainJob's unit", lambda: unit(sb, ns, "trainjob-tune"))
        assert consumer_ref(queued) == consumer(created)
        assert pod_sets(queued) == {"node": 2}  # read from Trainer's JobSet
        jobset = get(sb, "jobset", "tune", "-n", ns)
        assert jobset["spec"]["suspend"] is True
        (owner,) = [r for r in jobset["metadata"]["ownerReferences"] if r.get("controller")]
        assert (owner["kind"], owner["uid"]) == ("TrainJob", created["metadata"]["uid"])
        time.sleep(3)  # time enough to admit it (wrongly) or to queue the JobSet
        assert [u["metadata"]["name"] for u in units(sb, ns)] == ["trainjob-tune"]
        assert phase(unit(sb, ns, "trainjob-tune")) == "Enqueued"
        assert pods(sb, ns) == []  # room for 1 CPU of 2: not one pod
        assert allocated_cpu(sb, q) == "0"

        set_room(sb, ns, q, 2, pools=[pool_name])
        wait_for("both training pods Running", lambda: len(running(sb, ns)) == 2, timeout=60)
        for pod in pods(sb, ns):
            assert selector.items() <= (pod["spec"].get("nodeSelector") or {}).items(), pod
            assert pod["spec"]["nodeName"] in POOL_NODES
            assert pod["metadata"]["annotations"][POD_COMPLETE_DELAY_ANNOTATION] == LONG
        placed = get(sb, "trainjob", "tune", "-n", ns)
        assert placed["spec"]["suspend"] is False
        assert [p["manager"] for p in placed["spec"]["runtimePatches"]] == \
            [TENANT_MANAGER, MANAGER]
        assert [u["metadata"]["name"] for u in units(sb, ns)] == ["trainjob-tune"]
        assert allocated_cpu(sb, q) == "2"


def test_reclaim_suspends_the_trainjob_whole_and_it_runs_again_whole_in_its_pool(
        integrated: Sandbox) -> None:
    sb = integrated
    quiet(sb)
    with pool(sb, POOL_NODES) as (pool_name, selector), \
            tenant(sb, "tjr", wait=60, pools=[pool_name]) as (ns, q), \
            tenant(sb, "jobr", wait=60, pools=[pool_name],
                   guarantee={"cpu": str(len(POOL_NODES))}) as (other_ns, _):
        create(sb, trainjob("tune", ns, 2))
        wait_for("its 2 pods Running", lambda: len(running(sb, ns)) == 2, timeout=60)
        placed = get(sb, "trainjob", "tune", "-n", ns)["spec"]["runtimePatches"]
        # Under its guarantee, the other queue's 3-CPU Job reclaims the TrainJob
        # (the pool has 4 CPUs; the TrainJob holds 2).
        create(sb, job_of("batch", other_ns, 3, runs_for="8s"))
        wait_for("the TrainJob suspended again",
                 lambda: suspended(sb, ns, "trainjob", "tune"), timeout=60)
        wait_for("Trainer suspends its JobSet", lambda: suspended(sb, ns, "jobset", "tune"),
                 timeout=30)
        wait_for("its pods gone", lambda: pods(sb, ns) == [], timeout=60)
        assert phase(unit(sb, ns, "trainjob-tune")) == "Enqueued"  # requeued, not Failed
        # Trainer refuses runtimePatches changes while its Jobs are active: ours stays.
        assert get(sb, "trainjob", "tune", "-n", ns)["spec"]["runtimePatches"] == placed
        wait_for("the TrainJob running again whole", lambda: len(running(sb, ns)) == 2,
                 timeout=90)
        assert not suspended(sb, ns, "trainjob", "tune")
        for pod in pods(sb, ns):
            assert selector.items() <= (pod["spec"].get("nodeSelector") or {}).items(), pod
        assert phase(unit(sb, ns, "trainjob-tune")) in ("Dequeued", "Running")
        assert allocated_cpu(sb, q) == "2"
