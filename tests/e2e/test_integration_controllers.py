"""The integration controllers the sandbox runs (`arbiter.sandbox.integrations`)
work on their own, before arbiter integrates them: in a namespace arbiter
does not manage, a JobSet runs its child Jobs to completion, a
LeaderWorkerSet makes its leader and worker StatefulSets and pods, KubeRay
makes a RayCluster's head and worker pods, and Kubeflow Trainer makes a
TrainJob's JobSet from the `torch-distributed` runtime (its JobSet is the
sandbox's: the JobSet controller runs it), on the real managers with their
webhooks, on kwok's nodes.

On the `integrated` sandbox (tests/e2e/conftest.py: all four controllers),
in a namespace removed afterwards; the objects leave out what the
controllers' defaulting webhooks fill in, so a webhook that does not answer
fails here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arbiter.core.api import MANAGED_LABEL
from arbiter.integrations import parse_names
from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, Sandbox
from tests.e2e.helpers import create, delete_tenants, get, namespace, unique_name, wait_for

CONTAINER = {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}


@pytest.fixture(scope="module")
def cluster(integrated: Sandbox) -> Sandbox:
    # A controller that does not come up fails `integrated` with its log's end.
    return integrated


@pytest.fixture(scope="module")
def unmanaged(cluster: Sandbox) -> Iterator[str]:
    name = unique_name("integrations")
    create(cluster, namespace(name, {MANAGED_LABEL: "false"}))
    yield name
    # Its pods would hold room the other integration tests count on.
    delete_tenants(cluster, [name], [], wait=60)


def _owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    return any(ref["uid"] == owner["metadata"]["uid"] and ref.get("controller")
               for ref in obj["metadata"].get("ownerReferences", []))


def _running(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running")


def test_jobset_runs_its_child_jobs_to_completion(cluster: Sandbox, unmanaged: str) -> None:
    name = unique_name("js")
    template = {"metadata": {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: "10s"}},
                "spec": {"containers": [CONTAINER]}}  # restartPolicy: the webhook's default
    create(cluster, {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "namespace": unmanaged},
        "spec": {"replicatedJobs": [
            {"name": "driver", "replicas": 1, "template": {"spec": {"template": template}}},
            {"name": "workers", "replicas": 2, "template": {"spec": {
                "parallelism": 2, "completions": 2, "template": template}}},
        ]}})
    jobset = get(cluster, "jobset", name, "-n", unmanaged)
    # Defaulted by JobSet's mutating webhook, not by the CRD schema.
    assert jobset["spec"]["successPolicy"]["operator"] == "All"

    def children() -> list[dict[str, Any]] | None:
        jobs = [j for j in get(cluster, "jobs", "-n", unmanaged)["items"] if _owned_by(j, jobset)]
        return jobs if len(jobs) == 3 else None

    jobs = wait_for("the JobSet's three child Jobs", children)
    assert sorted(j["metadata"]["name"] for j in jobs) == [
        f"{name}-driver-0", f"{name}-workers-0", f"{name}-workers-1"]
    for job in jobs:
        assert job["spec"]["completionMode"] == "Indexed"
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    selector = f"jobset.sigs.k8s.io/jobset-name={name}"
    wait_for("all 5 pods Running on kwok nodes", lambda: len(_running(
        get(cluster, "pods", "-n", unmanaged, "-l", selector)["items"])) == 5)

    def completed() -> bool:
        status = get(cluster, "jobset", name, "-n", unmanaged).get("status") or {}
        return any(c["type"] == "Completed" and c["status"] == "True"
                   for c in status.get("conditions") or [])

    wait_for("the JobSet Completed", completed, timeout=45)


def test_leaderworkerset_makes_its_groups(cluster: Sandbox, unmanaged: str) -> None:
    name = unique_name("lws")
    create(cluster, {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": unmanaged},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {
            "size": 3, "workerTemplate": {"spec": {"containers": [CONTAINER]}}}}})
    lws = get(cluster, "leaderworkerset", name, "-n", unmanaged)
    assert lws["spec"]["rolloutStrategy"]["type"] == "RollingUpdate"  # the webhook's default

    def statefulsets() -> dict[str, dict[str, Any]] | None:
        items = get(cluster, "statefulsets", "-n", unmanaged)["items"]
        return {s["metadata"]["name"]: s for s in items} if len(items) == 3 else None

    sets = wait_for("the leader StatefulSet and one worker StatefulSet per group",
                    statefulsets)
    assert set(sets) == {name, f"{name}-0", f"{name}-1"}
    assert sets[name]["spec"]["replicas"] == 2 and _owned_by(sets[name], lws)
    for group in ("0", "1"):
        assert sets[f"{name}-{group}"]["spec"]["replicas"] == 2

    selector = f"leaderworkerset.sigs.k8s.io/name={name}"
    expected = sorted([f"{name}-0", f"{name}-1", f"{name}-0-1", f"{name}-0-2",
                       f"{name}-1-1", f"{name}-1-2"])
    wait_for("2 leaders and 4 workers Running", lambda: _running(
        get(cluster, "pods", "-n", unmanaged, "-l", selector)["items"]) == expected)
    leaders = get(cluster, "pods", "-n", unmanaged, "-l",
                  f"{selector},leaderworkerset.sigs.k8s.io/worker-index=0")["items"]
    # Labelled by LWS's pod webhook: the group each leader leads.
    assert sorted(p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
                  for p in leaders) == ["0", "1"]
    wait_for("the LWS reports 2 ready groups", lambda: (get(
        cluster, "leaderworkerset", name, "-n", unmanaged).get("status") or {}).get(
            "readyReplicas") == 2)


def test_kuberay_makes_a_rayclusters_pods(cluster: Sandbox, unmanaged: str) -> None:
    name = unique_name("ray")
    ray = {"name": "ray", "image": "rayproject/ray:2.52.0",
           "resources": {"requests": {"cpu": "100m"}}}
    create(cluster, {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": name, "namespace": unmanaged},
        "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
                     "containers": [ray]}}},
                 "workerGroupSpecs": [{"groupName": "cpu", "replicas": 2, "minReplicas": 0,
                                       "maxReplicas": 4, "rayStartParams": {},
                                       "template": {"spec": {"containers": [ray]}}}]}})
    raycluster = get(cluster, "raycluster", name, "-n", unmanaged)
    selector = f"ray.io/cluster={name}"
    wait_for("the head and 2 worker pods Running on kwok nodes", lambda: len(_running(
        get(cluster, "pods", "-n", unmanaged, "-l", selector)["items"])) == 3)
    pods = get(cluster, "pods", "-n", unmanaged, "-l", selector)["items"]
    assert all(_owned_by(p, raycluster) for p in pods)
    assert sorted(p["metadata"]["labels"]["ray.io/node-type"] for p in pods) == [
        "head", "worker", "worker"]
    # KubeRay's injected init container, which arbiter counts in a worker's requests.
    worker = next(p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker")
    assert [c["name"] for c in worker["spec"]["initContainers"]] == ["wait-gcs-ready"]


def test_trainer_makes_a_trainjobs_jobset(cluster: Sandbox, unmanaged: str) -> None:
    # Trainer's runtime, from its module, validated by Trainer's webhook.
    runtime = get(cluster, "clustertrainingruntime", "torch-distributed")
    assert runtime["spec"]["mlPolicy"]["torch"] == {}
    name = unique_name("tj")
    create(cluster, {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "namespace": unmanaged},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"numNodes": 2, "resourcesPerNode": {"requests": {"cpu": "100m"}}}}})
    trainjob = get(cluster, "trainjob", name, "-n", unmanaged)
    jobset = wait_for("Trainer's JobSet for the TrainJob", lambda: next(
        (j for j in get(cluster, "jobsets", "-n", unmanaged)["items"]
         if _owned_by(j, trainjob)), None))
    (node,) = [r for r in jobset["spec"]["replicatedJobs"] if r["name"] == "node"]
    assert node["template"]["spec"]["parallelism"] == 2
    selector = f"jobset.sigs.k8s.io/jobset-name={jobset['metadata']['name']}"
    wait_for("its 2 trainer pods Running", lambda: len(_running(
        get(cluster, "pods", "-n", unmanaged, "-l", selector)["items"])) == 2)


def test_arbiter_queues_the_kinds_the_sandbox_runs(cluster: Sandbox) -> None:
    record = cluster.processes()["arbiter"]
    flag = record.args[record.args.index("--integrations") + 1]
    assert parse_names(flag) == ("statefulset", "deployment", "jobset", "lws", "raycluster",
                                 "rayjob", "trainer")
    # It watches them: each kind listed (a missing CRD would be reported instead).
    log = Path(record.log).read_text(errors="replace")
    for kind in ("JobSet", "LeaderWorkerSet", "StatefulSet", "RayCluster", "RayJob", "TrainJob"):
        assert f'"listed","kind":"{kind}"' in log, kind
