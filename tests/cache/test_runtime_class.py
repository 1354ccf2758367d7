"""RuntimeClass overhead (issue #25 row 13): a pod's requests include
`spec.overhead`, which the RuntimeClass admission plugin fills in from its
class; a Job's template has only the class's name, so its unit adds the
cached RuntimeClass's overhead per pod."""

from __future__ import annotations

from typing import Any

from arbiter.cache import convert
from arbiter.cache.store import ClusterStore
from arbiter.loop.units import job_unit

GVISOR = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
          "metadata": {"name": "gvisor"}, "handler": "runsc",
          "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}}}


def _job(pod_spec: dict[str, Any], parallelism: int = 4) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "team-a", "uid": "u-1",
                         "labels": {"arbiter.dev/queue": "a"}},
            "spec": {"parallelism": parallelism, "suspend": True, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}],
                **pod_spec}}}}


def _demand(store: ClusterStore, pod_spec: dict[str, Any]) -> dict[str, int]:
    store.apply("Job", "ADDED", _job(pod_spec))
    unit = job_unit(store.jobs["team-a/train"], store.priority_classes, store.runtime_classes)
    assert unit is not None
    total: dict[str, int] = {}
    for pod_set in unit.pod_sets:
        for name, amount in pod_set.requests.scale(pod_set.count).items():
            total[name] = total.get(name, 0) + amount
    return total


def test_a_jobs_unit_counts_its_runtime_classes_overhead() -> None:
    store = ClusterStore()
    store.apply("RuntimeClass", "ADDED", GVISOR)
    assert store.runtime_classes["gvisor"].overhead == {"cpu": 250, "memory": 120 * 2**20}
    assert _demand(store, {"runtimeClassName": "gvisor"}) == {
        "cpu": 4 * 1250, "memory": 4 * 120 * 2**20}
    # A template that states the overhead itself is not charged it twice.
    stated = {"runtimeClassName": "gvisor", "overhead": {"cpu": "250m", "memory": "120Mi"}}
    assert _demand(store, stated) == {"cpu": 4 * 1250, "memory": 4 * 120 * 2**20}
    # No such class (yet): the template's own requests.
    assert _demand(store, {"runtimeClassName": "kata"}) == {"cpu": 4000}
    store.apply("RuntimeClass", "DELETED", GVISOR)
    assert _demand(store, {"runtimeClassName": "gvisor"}) == {"cpu": 4000}


def test_a_pods_requests_include_the_overhead_admission_filled_in() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "team-a", "uid": "p-1"},
           "spec": {"runtimeClassName": "gvisor", "overhead": {"cpu": "250m"},
                    "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]}}
    assert convert.pod_from_api(pod).requests == {"cpu": 1250}
