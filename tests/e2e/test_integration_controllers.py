"""The integration controllers the sandbox runs (`arbiter.sandbox.integrations`)
work on their own, before arbiter integrates them: in a namespace arbiter
does not manage, a JobSet runs its child Jobs to completion and a
LeaderWorkerSet makes its leader and worker StatefulSets and pods, on the
real JobSet and LWS managers with their webhooks, on kwok's nodes.

On the `integrated` sandbox (tests/e2e/conftest.py: both controllers), in a
namespace removed afterwards; the objects leave out what the controllers'
defaulting webhooks fill in, so a webhook that does not answer fails here.
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


def test_arbiter_queues_the_kinds_the_sandbox_runs(cluster: Sandbox) -> None:
    record = cluster.processes()["arbiter"]
    flag = record.args[record.args.index("--integrations") + 1]
    assert parse_names(flag) == ("statefulset", "deployment", "jobset", "lws")
    # It watches them: each kind listed (a missing CRD would be reported instead).
    log = Path(record.log).read_text(errors="replace")
    for kind in ("JobSet", "LeaderWorkerSet", "StatefulSet"):
        assert f'"listed","kind":"{kind}"' in log, kind
