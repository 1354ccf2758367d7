"""RayCluster and RayJob queued whole (issue 29, DESIGN §14) on the real
KubeRay operator: one unit each (`raycluster-<name>`: `head` and a set per
worker group; `rayjob-<name>`: its cluster's sets and the submitter), held
by `spec.suspend` until all of it fits, placed into its pool, suspended
again by reclaim (KubeRay deletes the pods) and admitted whole again.

KWOK runs no Ray, so a RayJob never finishes here (its dashboard never
answers): admission, placement and reclaim are tested, not completion.

On the `integrated` sandbox (8 fake nodes x 1 CPU); the primary arbiter
runs with a short reclaim grace for this module.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, Sandbox
from tests.e2e.helpers import create, get, tenant, units, wait_for
from tests.e2e.workloads import (
    CPUS,
    NODES,
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
POOL_NODES = NODES[-5:]
IMAGE = "rayproject/ray:2.52.0"


def ray_template(cpu: str = "1") -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "ray", "image": IMAGE,
                                     "resources": {"requests": {"cpu": cpu}}}]}}


def cluster_spec(workers: int) -> dict[str, Any]:
    return {"headGroupSpec": {"rayStartParams": {}, "template": ray_template()},
            "workerGroupSpecs": [{"groupName": "cpu", "replicas": workers, "minReplicas": 0,
                                  "maxReplicas": workers, "rayStartParams": {},
                                  "template": ray_template()}]}


def raycluster(name: str, ns: str, workers: int) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": ns}, "spec": cluster_spec(workers)}


def reclaim_with_a_job(sandbox: Sandbox, other_ns: str) -> None:
    """A 4-CPU Job of a queue under its guarantee in the pool (5 nodes, a
    unit is admitted into one pool): it takes back what it needs."""
    create(sandbox, job_of("batch", other_ns, 4, runs_for="5s"))


def test_a_raycluster_waits_whole_runs_whole_in_its_pool_and_comes_back_after_reclaim(
        integrated: Sandbox) -> None:
    sb = integrated
    quiet(sb)
    with pool(sb, POOL_NODES) as (pool_name, selector), \
            tenant(sb, "rc", wait=60, capability={"cpu": "4"}, pools=[pool_name]) as (ns, q), \
            tenant(sb, "rcjob", wait=60, guarantee={"cpu": str(CPUS)},
                   pools=[pool_name]) as (other_ns, _):
        create(sb, raycluster("rc", ns, 4))
        created = get(sb, "raycluster", "rc", "-n", ns)
        assert created["spec"]["suspend"] is True  # held at the door
        queued = wait_for("the RayCluster's unit", lambda: unit(sb, ns, "raycluster-rc"))
        assert consumer_ref(queued) == consumer(created)
        assert pod_sets(queued) == {"head": 1, "cpu": 4}
        time.sleep(3)  # time enough to admit it (wrongly)
        assert phase(unit(sb, ns, "raycluster-rc")) == "Enqueued"
        assert suspended(sb, ns, "raycluster", "rc") and pods(sb, ns) == []  # 5 CPUs, room 4

        set_room(sb, ns, q, 5, pools=[pool_name])
        wait_for("the head and 4 workers Running", lambda: len(running(sb, ns)) == 5)
        for pod in pods(sb, ns):
            assert selector.items() <= (pod["spec"].get("nodeSelector") or {}).items(), pod
            assert pod["spec"]["nodeName"] in POOL_NODES
            assert pod["metadata"]["labels"]["ray.io/cluster"] == "rc"

        # 4 pool CPUs for a queue under its guarantee: the cluster holds all 5; it goes whole.
        reclaim_with_a_job(sb, other_ns)
        wait_for("the RayCluster suspended again", lambda: suspended(sb, ns, "raycluster", "rc"))
        wait_for("KubeRay deleting all its pods", lambda: pods(sb, ns) == [])
        assert phase(unit(sb, ns, "raycluster-rc")) == "Enqueued"  # requeued, not Failed
        wait_for("the RayCluster running again, whole", lambda: len(running(sb, ns)) == 5,
                 timeout=90)
        assert not suspended(sb, ns, "raycluster", "rc")


def test_a_rayjob_is_one_unit_and_its_cluster_has_none(integrated: Sandbox) -> None:
    sb = integrated
    quiet(sb)
    with pool(sb, POOL_NODES) as (pool_name, selector), \
            tenant(sb, "rj", wait=60, pools=[pool_name]) as (ns, _), \
            tenant(sb, "rjjob", wait=60, guarantee={"cpu": str(CPUS)},
                   pools=[pool_name]) as (other_ns, _):
        # The submitter keeps running (KWOK would complete a Job's pod at once).
        submitter = ray_template("500m")
        submitter["metadata"] = {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: "10m"}}
        create(sb, {"apiVersion": "ray.io/v1", "kind": "RayJob",
                    "metadata": {"name": "rj", "namespace": ns},
                    "spec": {"entrypoint": "python -c 'print(1)'",
                             "shutdownAfterJobFinishes": True,
                             "rayClusterSpec": cluster_spec(2),
                             "submitterPodTemplate": submitter}})
        created = get(sb, "rayjob", "rj", "-n", ns)  # admitted at once: it fits
        queued = wait_for("the RayJob's unit", lambda: unit(sb, ns, "rayjob-rj"))
        assert consumer_ref(queued) == consumer(created)
        assert pod_sets(queued) == {"head": 1, "cpu": 2, "submitter": 1}

        def cluster() -> dict[str, Any] | None:
            return next(iter(get(sb, "rayclusters", "-n", ns)["items"]), None)

        made = wait_for("KubeRay's RayCluster for the RayJob", cluster)
        assert made["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
        wait_for("its head and 2 workers Running",
                 lambda: len(running(sb, ns, "ray.io/cluster")) == 3)
        for pod in pods(sb, ns, "ray.io/cluster"):
            assert selector.items() <= (pod["spec"].get("nodeSelector") or {}).items(), pod
        # One unit: the cluster KubeRay made (labelled with the queue) has none.
        assert [u["metadata"]["name"] for u in units(sb, ns)] == ["rayjob-rj"]

        reclaim_with_a_job(sb, other_ns)  # the RayJob holds 4 of the pool's 5 nodes
        wait_for("the RayJob suspended again", lambda: suspended(sb, ns, "rayjob", "rj"))
        wait_for("KubeRay deleting its cluster and pods",
                 lambda: cluster() is None and pods(sb, ns) == [])
        assert phase(unit(sb, ns, "rayjob-rj")) == "Enqueued"
