"""DESIGN §13, the loop's side: a unit whose namespace its queue does not
admit is never admitted nor charged there; units in unmanaged namespaces
are ignored whatever their status says; `listed` mode keeps the managed
label on the namespaces the Queues admit."""

from __future__ import annotations

from typing import Any

from arbiter.base.kubeapi import unit_path
from arbiter.core.api import MANAGED_BY_ARBITER_ANNOTATION, MANAGED_LABEL, QUEUE_LABEL
from arbiter.loop.namespaces import MARK, apply_label_patches, label_patches
from tests.loop.harness import Cluster

BARRED = ('queue "team-b" does not admit namespace "a" (neither its spec.namespaces nor '
          "its spec.namespaceSelector): the unit waits until it does")


async def _reserve(c: Cluster, namespace: str, name: str, queue: str, cpu: str = "1",
                   count: int = 1) -> None:
    await c.api.create(unit_path(namespace), {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"queue": queue, "podSets": [{"name": "main", "count": count,
                                              "requests": {"cpu": cpu}}]},
    })


def _message(c: Cluster, namespace: str, name: str) -> str:
    return str((c.unit_obj(namespace, name).get("status") or {}).get("message", ""))


async def test_reservation_whose_queue_stops_admitting_it_is_not_admitted_nor_charged() -> None:
    c = Cluster()
    await c.nodes(2)
    await c.queue("team-b", namespaces=["a", "b"])
    await _reserve(c, "a", "first", "team-b")
    await c.settle()
    assert c.phase("a", "first") == "Dequeued"
    await _reserve(c, "a", "second", "team-b")
    await _reserve(c, "a", "third", "team-b")  # waits: 2 CPUs, 2 reserved
    await c.settle()
    assert c.phase("a", "third") is None  # waiting (the publisher writes its phase)
    await c.set_queue("team-b", namespaces=["b"])
    await c.settle()
    for name in ("first", "second", "third"):
        assert c.phase("a", name) == "Enqueued", name
        assert _message(c, "a", name) == BARRED
    assert c.controller.mirror.admitted.get("team-b", 0) == 0
    # Nothing is charged: team-b's own namespace gets both CPUs.
    await _reserve(c, "b", "own", "team-b", count=2)
    await c.settle()
    assert c.phase("b", "own") == "Dequeued"
    assert c.phase("a", "third") == "Enqueued"
    # Admitted again, the units wait their turn as usual.
    await c.set_queue("team-b", namespaces=["a", "b"])
    await c.settle()
    assert c.phase("a", "first") == "Enqueued"
    await c.api.delete(unit_path("b", "own"))
    await c.settle()
    assert sorted(name for name in ("first", "second", "third")
                  if c.phase("a", name) == "Dequeued") == ["first", "second"]


async def test_job_naming_a_foreign_queue_stays_suspended_and_an_admitted_one_is_held() -> None:
    c = Cluster()
    await c.nodes(2)
    await c.queue("team-b", namespaces=["b"])
    await c.queue("team-a", namespaces=["a"])
    await c.job("a", "sneaky", "team-b")  # as if the webhook had been bypassed
    await c.job("a", "mine", "team-a")
    await c.settle()
    assert c.phase("a", "job-sneaky") == "Enqueued"
    assert _message(c, "a", "job-sneaky") == BARRED
    assert c.suspended("a", "sneaky")
    assert c.phase("a", "job-mine") == "Dequeued" and not c.suspended("a", "mine")
    # The queue stops admitting a: its running Job is suspended and requeued.
    c.run_job("a", "mine")
    await c.settle()
    await c.set_queue("team-a", namespaces=["other"])
    await c.settle()
    assert c.suspended("a", "mine")
    assert c.phase("a", "job-mine") == "Enqueued"
    assert 'queue "team-a" does not admit namespace "a"' in _message(c, "a", "job-mine")


async def test_unit_in_an_unmanaged_namespace_with_forged_status_is_not_charged() -> None:
    c = Cluster()
    await c.nodes(2)
    await c.queue("q")
    await c.api.create("/api/v1/namespaces", {
        "metadata": {"name": "out", "labels": {MANAGED_LABEL: "false"}}})
    await _reserve(c, "out", "forged", "q", count=2)
    c.api.set_status(unit_path("out", "forged"), {
        "phase": "Dequeued", "admissions": [{"time": "2025-01-01T00:00:00Z"}],
        "allocated": {"cpu": "2"}})
    await c.settle()
    assert c.controller.mirror.state("out/forged") is None
    await _reserve(c, "in", "real", "q", count=2)
    await c.settle()
    assert c.phase("in", "real") == "Dequeued"  # the forged 2 CPUs were never counted
    assert c.phase("out", "forged") == "Dequeued"  # and the unit itself is not touched


async def _namespace(c: Cluster, name: str, labels: dict[str, str] | None = None,
                     annotations: dict[str, str] | None = None) -> None:
    await c.api.create("/api/v1/namespaces", {"metadata": {
        "name": name, "labels": {"kubernetes.io/metadata.name": name, **(labels or {})},
        "annotations": annotations or {}}})


def _ns_meta(c: Cluster, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = c.api.objects[f"/api/v1/namespaces/{name}"]["metadata"]
    return meta


async def test_listed_mode_labels_admitted_namespaces_and_removes_only_its_own_label() -> None:
    c = Cluster()
    c.store.managed_mode = "listed"
    await c.queue("team-a", namespaces=["a"])
    await c.queue("gpu", namespaceSelector={"matchLabels": {"tier": "gold"}})
    await c.queue("shared")  # open: does not make a namespace managed
    await _namespace(c, "a")
    await _namespace(c, "gold", {"tier": "gold"})
    await _namespace(c, "ingress")
    await _namespace(c, "admins", {MANAGED_LABEL: "true"})
    await _namespace(c, "optout", {MANAGED_LABEL: "false", "tier": "gold"})
    await _namespace(c, "kube-system", {"tier": "gold"})
    assert sorted(label_patches(c.store)) == ["a", "gold"]
    assert await apply_label_patches(c.api, c.store) == 2
    for name in ("a", "gold"):
        meta = _ns_meta(c, name)
        assert meta["labels"][MANAGED_LABEL] == "true"
        assert meta["annotations"][MANAGED_BY_ARBITER_ANNOTATION] == MARK
        assert c.store.is_managed_namespace(name)
    for name in ("ingress", "optout", "kube-system"):
        assert _ns_meta(c, name)["labels"].get(MANAGED_LABEL) != "true", name
        assert not c.store.is_managed_namespace(name)
    assert label_patches(c.store) == {}  # settled
    # No Queue admits them any more: arbiter's labels go, the admin's stays.
    await c.set_queue("team-a", namespaces=["elsewhere"])
    await c.api.delete("/apis/arbiter.dev/v1alpha1/queues/gpu")
    assert sorted(label_patches(c.store)) == ["a", "gold"]
    assert await apply_label_patches(c.api, c.store) == 2
    for name in ("a", "gold"):
        meta = _ns_meta(c, name)
        assert MANAGED_LABEL not in meta["labels"]
        assert MANAGED_BY_ARBITER_ANNOTATION not in meta["annotations"]
        assert not c.store.is_managed_namespace(name)
    assert _ns_meta(c, "admins")["labels"][MANAGED_LABEL] == "true"
    assert c.store.is_managed_namespace("admins")


async def test_listed_mode_ignores_work_in_namespaces_no_queue_admits() -> None:
    c = Cluster()
    c.store.managed_mode = "listed"
    await c.nodes(1)
    await c.queue("q", namespaces=["a"])
    await c.job("ingress", "controller", "q")
    await c.job("a", "train", "q")
    await c.settle()
    assert unit_path("ingress", "job-controller") not in c.api.objects
    assert c.phase("a", "job-train") == "Dequeued"
    labels = c.api.objects["/apis/batch/v1/namespaces/a/jobs/train"]["metadata"]["labels"]
    assert labels[QUEUE_LABEL] == "q"
