"""Queue validation: fields named in every error, namespaces, parents, deletion."""

from __future__ import annotations

from typing import Any

import pytest

from arbiter.cache.store import ClusterStore
from arbiter.core.api import QUEUE_LABEL
from tests.webhook.admission_samples import (
    ARBITER_USER,
    env_for,
    held,
    job,
    kubectl_run_pod,
    make_store,
    parse,
    queue_obj,
    review,
    unit_obj,
)
from webhook import jobs, pods, queues, queueunits
from webhook.review import Decision


def _store(units: list[dict[str, Any]] | None = None) -> ClusterStore:
    return make_store(queues=[
        queue_obj("root"), queue_obj("a", parent="root", namespaces=["team-a"]),
        queue_obj("b", parent="a"),
    ], units=units)


def _check(obj: dict[str, Any], store: ClusterStore | None = None,
           operation: str = "CREATE") -> Decision:
    old = obj if operation == "UPDATE" else None
    return queues.validate(parse(review("Queue", operation, obj, old=old)),
                           env_for(store or _store()))


def test_valid_queue_is_allowed() -> None:
    assert _check(queue_obj("c", weight=3, guarantee={"cpu": "2"},
                            capability={"cpu": "4", "memory": "8Gi"},
                            namespaces=["team-c"], parent="root")).allowed


def test_weight_must_be_positive_integer() -> None:
    for weight in (0, -1, 1.5, "2", True):
        decision = _check(queue_obj("c", weight=weight))
        assert not decision.allowed and "spec.weight" in decision.message, weight
        assert decision.code == 422


def test_bad_quantity_names_the_field() -> None:
    decision = _check(queue_obj("c", guarantee={"cpu": "lots"}))
    assert not decision.allowed
    assert "spec.guarantee.cpu: 'lots' is not a valid quantity" in decision.message


def test_guarantee_may_not_exceed_capability() -> None:
    decision = _check(queue_obj("c", guarantee={"cpu": "3", "memory": "1Gi"},
                                capability={"cpu": "2"}))
    assert not decision.allowed
    assert "spec.guarantee.cpu (3) exceeds spec.capability.cpu (2)" in decision.message
    zero_cap = _check(queue_obj("c", guarantee={"cpu": "1"}, capability={"cpu": "0"}))
    assert not zero_cap.allowed


def test_namespace_claimed_by_another_queue_names_it() -> None:
    decision = _check(queue_obj("c", namespaces=["team-a"]))
    assert not decision.allowed
    assert 'namespace "team-a" is already listed by Queue "a"' in decision.message
    # Updating the queue that owns the namespace is fine.
    assert _check(queue_obj("a", parent="root", namespaces=["team-a", "x"]),
                  operation="UPDATE").allowed


def test_parent_must_exist_and_not_cycle() -> None:
    missing = _check(queue_obj("c", parent="ghost"))
    assert 'spec.parent: queue "ghost" does not exist' in missing.message
    self_parent = _check(queue_obj("c", parent="c"))
    assert "cannot be its own parent" in self_parent.message
    cycle = _check(queue_obj("root", parent="b"), operation="UPDATE")
    assert not cycle.allowed
    assert "cycle: root → b → a → root" in cycle.message


def test_name_must_fit_a_label_value() -> None:
    decision = _check(queue_obj("x" * 64))
    assert not decision.allowed and "metadata.name" in decision.message


def test_enum_and_type_checks() -> None:
    decision = _check(queue_obj("c", state="Paused", queuePolicy="LIFO", blocking="yes",
                                nodeSelector={"zone": 1},
                                preemption={"withinQueue": "Always"}))
    for field in ("spec.state", "spec.queuePolicy", "spec.blocking", "spec.nodeSelector",
                  "spec.preemption.withinQueue"):
        assert field in decision.message


def test_errors_are_one_line() -> None:
    decision = _check(queue_obj("c", weight=0, guarantee={"cpu": "x"}, parent="ghost"))
    assert "\n" not in decision.message and decision.message.count(";") == 2


def _admitted(queue: str, phase: str) -> dict[str, Any]:
    return unit_obj("job-train", "team-a", {"queue": queue, "podSets": [
        {"name": "main", "count": 1, "requests": {"cpu": "1"}}]}, phase=phase)


def test_delete_denied_while_admitted_units_remain() -> None:
    store = _store([_admitted("b", "Running")])
    decision = queues.validate(parse(review("Queue", "DELETE", None, old=queue_obj("b"))),
                               env_for(store))
    assert not decision.allowed
    assert 'queue "b" still has 1 admitted unit(s) (team-a/job-train)' in decision.message


def test_delete_allowed_with_only_pending_units() -> None:
    store = _store([_admitted("b", "Enqueued")])
    assert queues.validate(parse(review("Queue", "DELETE", None, old=queue_obj("b"))),
                           env_for(store)).allowed


def test_delete_of_a_parent_is_denied() -> None:
    decision = queues.validate(
        parse(review("Queue", "DELETE", None, old=queue_obj("a"),
                     user={"username": ARBITER_USER})), env_for(_store()))
    assert not decision.allowed and "parent of b" in decision.message


def test_guarantees_beyond_capacity_warn() -> None:
    store = _store()
    store.apply("Node", "ADDED", {
        "metadata": {"name": "n1"},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    decision = _check(queue_obj("c", guarantee={"cpu": "6"}), store)
    assert decision.allowed
    assert decision.warnings and "guarantees of cpu add up to 6" in decision.warnings[0]


# -- bounded cost and Kubernetes resource names (issue 13, items 10, 11) ----
def test_a_5000_deep_parent_chain_is_checked_in_linear_time() -> None:
    import time

    depth = 5000
    chain = [queue_obj("q0")] + [queue_obj(f"q{i}", parent=f"q{i - 1}")
                                 for i in range(1, depth)]
    store = make_store(queues=chain)
    started = time.perf_counter()
    decision = _check(queue_obj("leaf", parent=f"q{depth - 1}"), store)
    elapsed = time.perf_counter() - started
    assert decision.allowed, decision.message
    # Re-parenting the root under the deepest queue closes a 5,000-long cycle.
    started = time.perf_counter()
    cycle = _check(queue_obj("q0", parent=f"q{depth - 1}"), store, operation="UPDATE")
    elapsed = max(elapsed, time.perf_counter() - started)
    assert not cycle.allowed and "would create a cycle" in cycle.message
    assert len(cycle.message) <= 1000
    # Quadratic took up to 0.8 s here, linear ~3 ms: the bound tells them apart
    # with room for a loaded machine.
    assert elapsed < 0.3, elapsed


@pytest.mark.parametrize("name", ["CPU", "cpu ", " cpu", "a/b/c", "Memory", "gpu",
                                  "example.com/", "/foo", "Example.com/foo",
                                  "example.com/foo bar", "requests.cpu", "kubernetes.io",
                                  "x" * 64, "hugepages"])
@pytest.mark.parametrize("field", ["guarantee", "capability"])
def test_resource_names_are_validated_as_kubernetes_does(name: str, field: str) -> None:
    decision = _check(queue_obj("c", **{field: {name: "1"}}))
    assert not decision.allowed, name
    assert f"spec.{field}" in decision.message and "resource name" in decision.message


@pytest.mark.parametrize("name", ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi",
                                  "hugepages-1Gi", "nvidia.com/gpu", "example.com/foo",
                                  "example.com/Foo_bar.1", "kubernetes.io/something"])
def test_standard_and_extended_resource_names_are_allowed(name: str) -> None:
    decision = _check(queue_obj("c", guarantee={name: "1"}, capability={name: "2"}))
    assert decision.allowed, decision.message


# -- hierarchical queues (DESIGN §11) ------------------------------------------

def test_child_order_must_be_fair_or_queue() -> None:
    assert _check(queue_obj("c", parent="root", childOrder="Queue")).allowed
    decision = _check(queue_obj("c", childOrder="Strict"))
    assert not decision.allowed
    assert "spec.childOrder: 'Strict' must be one of Fair, Queue" in decision.message


def test_work_labelled_for_a_parent_is_denied_naming_its_children() -> None:
    store = _store()
    for kind, obj in (
        ("Pod", kubectl_run_pod("web", "team-x", labels={QUEUE_LABEL: "root"})),
        ("Job", job("train", "team-x", labels={QUEUE_LABEL: "root"})),
    ):
        validate = pods.validate if kind == "Pod" else jobs.validate
        decision = validate(parse(review(kind, "CREATE", obj)), env_for(store))
        assert not decision.allowed, kind
        assert 'queue "root"' in decision.message and 'children ("a")' in decision.message
        assert "\n" not in decision.message
    # Queue "a" admits team-a only (team-x may not use it at all).
    unit = unit_obj("u", "team-a", {"queue": "a", "resourceUnit": {"cpu": "1"},
                                    "resourceNo": 1})
    decision = queueunits.validate(parse(review("QueueUnit", "CREATE", unit)), env_for(store))
    assert not decision.allowed and 'children ("b")' in decision.message
    # The leaf takes work; once b is gone, a is a leaf again.
    leaf = held(kubectl_run_pod("web", "team-x", labels={QUEUE_LABEL: "b"}))
    assert pods.validate(parse(review("Pod", "CREATE", leaf)), env_for(store)).allowed
    store.apply("Queue", "DELETED", queue_obj("b"))
    assert store.queue_children == {"root": {"a"}}
    decision = queueunits.validate(parse(review("QueueUnit", "CREATE", unit)), env_for(store))
    assert decision.allowed, decision.message


def test_children_index_follows_a_reparented_queue() -> None:
    store = _store()
    store.apply("Queue", "MODIFIED", queue_obj("b", parent="root"))
    assert store.queue_children == {"root": {"a", "b"}}
    decision = queues.validate(
        parse(review("Queue", "DELETE", None, old=queue_obj("a"),
                     user={"username": ARBITER_USER})), env_for(store))
    assert decision.allowed, decision.message


def test_a_queue_holding_work_cannot_become_a_parent() -> None:
    spec = {"queue": "b", "resourceUnit": {"cpu": "1"}, "resourceNo": 1}
    store = _store(units=[unit_obj("u1", "team-x", spec, phase="Enqueued"),
                          unit_obj("u0", "team-x", spec, phase="Succeed")])
    decision = _check(queue_obj("c", parent="b"), store)
    assert not decision.allowed
    assert ('spec.parent: queue "b" still holds 1 unit(s) of its own (team-x/u1)'
            in decision.message)
    # A queue that is a parent already takes more children.
    assert _check(queue_obj("c", parent="a"), store).allowed
