"""Item 13: pods of a Job arbiter does not hold (created before install, while
its namespace was opted out, or while the webhook was removed) are gated by
the webhook like plain pods, and must be admitted like plain pods: each is
its own unit. A Job arbiter holds is released by unsuspending it, so its pods
are never gated and stay with the Job's unit."""

from __future__ import annotations

from typing import Any

from arbiter.base.kubeapi import unit_path
from arbiter.core.api import ADMISSION_GATE, QUEUE_LABEL
from tests.loop.harness import Cluster


async def unlabelled_job(c: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """A Job that never went through the webhook: no queue label, not suspended."""
    return await c.api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"parallelism": 2, "template": {"spec": {"containers": [
            {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}},
    })


async def gated_job_pod(c: Cluster, job: dict[str, Any], name: str, queue: str) -> None:
    """A pod of `job` as the webhook lets it in: labelled with the namespace's
    queue and gated (it does not know the Job as one it holds)."""
    meta = job["metadata"]
    await c.api.create(f"/api/v1/namespaces/{meta['namespace']}/pods", {
        "metadata": {"name": name, "namespace": meta["namespace"],
                     "labels": {QUEUE_LABEL: queue},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                          "name": meta["name"], "uid": meta["uid"],
                                          "controller": True}]},
        "spec": {"containers": [{"name": "c", "image": "x",
                                 "resources": {"requests": {"cpu": "1"}}}],
                 "schedulingGates": [{"name": ADMISSION_GATE}]},
        "status": {"phase": "Pending"},
    })


async def test_gated_pods_of_an_unlabelled_job_are_admitted_as_pods() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    job = await unlabelled_job(c, "ns", "legacy")
    await gated_job_pod(c, job, "legacy-a", "q")
    await gated_job_pod(c, job, "legacy-b", "q")
    await c.settle()
    # One CPU: one pod admitted, the other waits in its queue with a unit
    # (whose status and Events say why), none stays gated without one.
    assert unit_path("ns", "job-legacy") not in c.api.objects
    assert c.released_pods("ns") == ["legacy-a"]
    assert c.phase("ns", "pod-legacy-a") == "Dequeued"
    assert c.phase("ns", "pod-legacy-b") in (None, "Enqueued")
    assert unit_path("ns", "pod-legacy-b") in c.api.objects
    owner = c.unit_obj("ns", "pod-legacy-a")["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Pod", "legacy-a")
