"""Kubeflow Trainer v2 TrainJob queued whole (issue 29, DESIGN §14) on the
real Trainer controller and its `torch-distributed` runtime: one unit
(`trainjob-<name>`) whose pod sets are read from the JobSet Trainer makes,
held by `spec.suspend` until all of it fits, then placed into its pool
through arbiter's `spec.runtimePatches` entry and unsuspended; Trainer's
JobSet, its Jobs and pods get no unit of their own.

On the `integrated` sandbox (8 fake nodes x 1 CPU).
"""

from __future__ import annotations

import time
from typing import Any

from arbiter.integrations.trainjob import MANAGER
from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, Sandbox
from tests.e2e.helpers import create, get, tenant, units, wait_for
from tests.e2e.workloads import (
    LONG,
    NODES,
    allocated_cpu,
    consumer,
    consumer_ref,
    phase,
    pod_sets,
    pods,
    pool,
    quiet,
    running,
    set_room,
    unit,
)

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
