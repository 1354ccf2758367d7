"""A declared kind through the loop (the `Widget` of a declaration: a driver
and workers, counts at different paths), on the in-memory apiserver: one
unit of both pod sets, admitted whole, placed into both templates and
unsuspended, held again (suspended, placement off), requeued at its new
size when a tenant changes a count after admission, running once a pod is
bound, finished from its declared condition."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from arbiter.cache.store import ClusterStore
from arbiter.integrations import enabled
from arbiter.testing import memory
from tests.integrations.declared_samples import WIDGETS, registered, widget, widget_integration
from tests.loop.harness import Cluster
from tests.loop.workloads import NS, gpu_node, gpu_pool


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    with registered() as (kind,):
        monkeypatch.setitem(memory._KINDS, "widgets", "Widget")
        yield Cluster(store=ClusterStore(integrations=(*enabled(()), kind)))


async def _widget(c: Cluster, name: str, workers: int = 2) -> dict[str, Any]:
    return await c.api.create(WIDGETS, widget(name, NS, workers=workers, suspend=True,
                                               queue="q"))


def _spec(c: Cluster, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = c.api.objects[f"{WIDGETS}/{name}"]["spec"]
    return spec


async def test_it_is_one_unit_admitted_whole_and_placed_into_every_template(
        cluster: Cluster) -> None:
    c = cluster
    await c.queue("q", namespaces=[NS])
    await gpu_pool(c, 2)
    created = await _widget(c, "w")
    await c.settle()
    unit = c.unit_obj(NS, "widget-w")
    assert unit["spec"]["consumerRef"] == {
        "apiVersion": "example.com/v1", "kind": "Widget", "namespace": NS, "name": "w",
        "uid": created["metadata"]["uid"]}
    assert [(s["name"], s["count"]) for s in unit["spec"]["podSets"]] == \
        [("driver", 1), ("workers", 2)]
    assert c.phase(NS, "widget-w") in (None, "Enqueued")  # 3 CPUs asked, 2 there
    assert _spec(c, "w")["suspend"] is True
    await gpu_node(c, 2)
    await c.settle()
    assert c.phase(NS, "widget-w") == "Dequeued"
    spec = _spec(c, "w")
    assert spec["suspend"] is False
    assert [spec[part]["template"]["spec"].get("nodeSelector")
            for part in ("driver", "workers")] == [{"pool": "gpu"}, {"pool": "gpu"}]

    await c.controller.actions.hold(c.store.units[f"{NS}/widget-w"])
    spec = _spec(c, "w")
    assert spec["suspend"] is True
    assert [spec[part]["template"]["spec"].get("nodeSelector")
            for part in ("driver", "workers")] == [None, None]


async def test_a_count_changed_after_admission_requeues_it_at_the_new_size(
        cluster: Cluster) -> None:
    c = cluster
    await c.queue("q", namespaces=[NS])
    await c.nodes(4)
    await _widget(c, "w")
    await c.settle()
    assert c.phase(NS, "widget-w") == "Dequeued"
    c.api.edit(f"{WIDGETS}/w", lambda o: o["spec"]["workers"].__setitem__("count", 5))
    await c.settle()
    unit = c.unit_obj(NS, "widget-w")
    assert [(s["name"], s["count"]) for s in unit["spec"]["podSets"]] == \
        [("driver", 1), ("workers", 5)]
    assert c.phase(NS, "widget-w") == "Enqueued"  # 6 CPUs do not fit in 4
    assert _spec(c, "w")["suspend"] is True


async def test_it_runs_once_a_pod_is_bound_and_finishes_from_its_condition(
        cluster: Cluster) -> None:
    c = cluster
    await c.queue("q", namespaces=[NS])
    await c.nodes(3)
    created = await _widget(c, "w")
    await c.settle()
    assert c.phase(NS, "widget-w") == "Dequeued"
    meta = created["metadata"]
    await c.api.create(f"/api/v1/namespaces/{NS}/pods", {
        "metadata": {"name": "w-driver-0", "namespace": NS,
                     "labels": {"arbiter.dev/queue": "q"},
                     "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "Widget",
                                          "name": "w", "uid": meta["uid"], "controller": True}]},
        "spec": {"nodeName": "node-0", "containers": [
            {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running"}})
    await c.settle()
    assert c.phase(NS, "widget-w") == "Running"
    c.api.set_status(f"{WIDGETS}/w", {"conditions": [{"type": "Complete", "status": "True"}]})
    await c.settle()
    assert c.phase(NS, "widget-w") == "Succeed"


async def test_a_list_pod_set_is_placed_into_every_elements_template(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kind = widget_integration(podSets=[
        {"name": "driver", "countPath": "spec.driver.replicas",
         "templatePath": "spec.driver.template"},
        {"name": "group", "countPath": "spec.groups[*].replicas",
         "templatePath": "spec.groups[*].template"}])
    with registered(kind):
        monkeypatch.setitem(memory._KINDS, "widgets", "Widget")
        c = Cluster(store=ClusterStore(integrations=(kind,)))
        await c.queue("q", namespaces=[NS])
        await gpu_pool(c, 4)
        obj = widget("w", NS, suspend=True, queue="q")
        template = obj["spec"]["driver"]["template"]
        obj["spec"]["groups"] = [{"replicas": 1, "template": template},
                                 {"replicas": 2, "template": template}]
        await c.api.create(WIDGETS, obj)
        await c.settle()
        unit = c.unit_obj(NS, "widget-w")
        assert [(s["name"], s["count"]) for s in unit["spec"]["podSets"]] == \
            [("driver", 1), ("group-0", 1), ("group-1", 2)]
        assert c.phase(NS, "widget-w") == "Dequeued"
        spec = _spec(c, "w")
        assert [group["template"]["spec"].get("nodeSelector") for group in spec["groups"]] == \
            [{"pool": "gpu"}, {"pool": "gpu"}]
