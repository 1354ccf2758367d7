"""Pools in the cache: conversion and node -> pool membership (DESIGN §10)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from arbiter.cache.convert import ConversionError, pool_from_api, queue_from_api, unit_from_api
from arbiter.cache.records import Taint, Toleration, UnitAdmission
from arbiter.cache.store import ClusterStore
from arbiter.core.model import DEFAULT_POOL, Placement


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "1"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pool(name: str, selector: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeSelector": selector, **spec}}


def test_pool_converts_selector_tolerations_and_taints() -> None:
    record = pool_from_api(pool("gpu", {"hw": "gpu"}, tolerations=[
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "team", "value": "a", "tolerationSeconds": 30},
    ], taints=[{"key": "gpu", "effect": "NoSchedule"}]))
    assert record.node_selector == (("hw", "gpu"),)
    assert record.tolerations == (
        Toleration(key="gpu", operator="Exists", effect="NoSchedule"),
        Toleration(key="team", value="a", toleration_seconds=30))
    assert [t.to_api() for t in record.tolerations] == [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "team", "operator": "Equal", "value": "a", "tolerationSeconds": 30}]
    assert record.taints == (Taint("gpu"),)
    hash(record)  # slim and hashable


@pytest.mark.parametrize("spec", [{"nodeSelector": ["a"]}, {"nodeSelector": {"a": 1}},
                                  {"tolerations": {"key": "x"}}, {"taints": [{"value": "v"}]}])
def test_bad_pool_names_the_field(spec: dict[str, Any]) -> None:
    with pytest.raises(ConversionError, match="spec"):
        pool_from_api({"metadata": {"name": "p"}, "spec": spec})


def test_queue_pools_keep_their_order_without_repeats() -> None:
    record = queue_from_api({"metadata": {"name": "q"},
                             "spec": {"pools": ["b", "a", "b"], "nodeSelector": {"z": "1"}}})
    assert record.pools == ("b", "a") and record.node_selector == (("z", "1"),)
    assert queue_from_api({"metadata": {"name": "q"}, "spec": {}}).pools == ()


def test_unit_admission_round_trips_and_tolerates_garbage() -> None:
    admission = {"pool": "gpu", "nodes": {"workers": ["n1", "n2"], "driver": ["n1"]}}
    record = unit_from_api({"metadata": {"name": "u", "namespace": "ns"},
                            "spec": {"queue": "q"}, "status": {"admission": admission}})
    assert record.admission == UnitAdmission(
        "gpu", (("driver", ("n1",)), ("workers", ("n1", "n2"))))
    assert record.admission.to_api() == admission
    assert record.admission.placement() == Placement("gpu", {"driver": ("n1",),
                                                             "workers": ("n1", "n2")})
    assert UnitAdmission.from_placement(record.admission.placement()) == record.admission
    assert record.admission.planned_nodes() == {"n1", "n2"}
    bad = unit_from_api({"metadata": {"name": "u", "namespace": "ns"}, "spec": {"queue": "q"},
                         "status": {"admission": {"pool": "p", "nodes": {"x": "n1"}}}})
    assert bad.admission is None


def test_first_pool_by_name_wins_and_the_rest_is_default() -> None:
    store = ClusterStore()
    store.apply("Node", "ADDED", node("n1", hw="gpu", zone="a"))
    store.apply("Node", "ADDED", node("n2", zone="a"))
    store.apply("Node", "ADDED", node("n3"))
    assert store.pool_of_node("n1") == DEFAULT_POOL
    assert store.nodes_in_pool(DEFAULT_POOL) == {"n1", "n2", "n3"}
    store.apply("Pool", "ADDED", pool("zone-a", {"zone": "a"}))
    store.apply("Pool", "ADDED", pool("gpu", {"hw": "gpu"}))  # "gpu" < "zone-a"
    assert store.pool_of_node("n1") == "gpu"
    assert store.nodes_in_pool("zone-a") == {"n2"}
    assert store.nodes_in_pool(DEFAULT_POOL) == {"n3"}
    store.apply("Pool", "DELETED", pool("gpu", {}))
    assert store.nodes_in_pool("zone-a") == {"n1", "n2"} and store.pool_of_node("n1") == "zone-a"
    assert store.nodes_in_pool("gpu") == set()
    # A node is relabelled, then deleted: only its own membership changes.
    store.apply("Node", "MODIFIED", node("n3", zone="a"))
    assert store.nodes_in_pool("zone-a") == {"n1", "n2", "n3"}
    assert store.nodes_in_pool(DEFAULT_POOL) == set()
    store.apply("Node", "DELETED", node("n1"))
    assert store.pool_of_node("n1") is None and store.nodes_in_pool("zone-a") == {"n2", "n3"}


def test_pool_selector_change_moves_nodes_and_bumps_the_version() -> None:
    store = ClusterStore()
    store.apply("Node", "ADDED", node("n1", tier="fast"))
    store.apply("Pool", "ADDED", pool("p", {"tier": "fast"}))
    version = store.membership.version
    store.apply("Pool", "MODIFIED", pool("p", {"tier": "slow"}))
    assert store.pool_of_node("n1") == DEFAULT_POOL and store.membership.version > version
    version = store.membership.version
    # Same selector, new tolerations: membership stays, the record is new.
    store.apply("Pool", "MODIFIED", pool("p", {"tier": "slow"}, tolerations=[{"key": "k"}]))
    assert store.membership.version == version
    assert store.membership.pool("p") == store.pools["p"]
    assert store.pools["p"].tolerations == (Toleration(key="k"),)


def test_a_node_heartbeat_does_not_touch_membership() -> None:
    store = ClusterStore()
    store.apply("Node", "ADDED", node("n1", a="1"))
    version = store.membership.version
    store.apply("Node", "MODIFIED", node("n1", a="1"))
    assert store.membership.version == version


def test_membership_matches_a_full_recomputation_after_random_changes() -> None:
    rng = random.Random(17)
    store = ClusterStore()
    keys = ("a", "b", "c")
    selectors: dict[str, dict[str, str]] = {}
    labels: dict[str, dict[str, str]] = {}
    for _ in range(400):
        action = rng.random()
        if action < 0.5:
            name = f"n{rng.randrange(30)}"
            labels[name] = {k: str(rng.randrange(2)) for k in keys if rng.random() < 0.6}
            store.apply("Node", "MODIFIED", node(name, **labels[name]))
        elif action < 0.6 and labels:
            name = rng.choice(sorted(labels))
            del labels[name]
            store.apply("Node", "DELETED", node(name))
        elif action < 0.9:
            name = f"p{rng.randrange(5)}"
            selectors[name] = {k: str(rng.randrange(2)) for k in keys if rng.random() < 0.5}
            store.apply("Pool", "MODIFIED", pool(name, selectors[name]))
        elif selectors:
            name = rng.choice(sorted(selectors))
            del selectors[name]
            store.apply("Pool", "DELETED", pool(name, {}))
        expected: dict[str, set[str]] = {}
        for node_name, node_labels in labels.items():
            owner = next((p for p in sorted(selectors)
                          if all(node_labels.get(k) == v for k, v in selectors[p].items())),
                         DEFAULT_POOL)
            assert store.pool_of_node(node_name) == owner
            expected.setdefault(owner, set()).add(node_name)
        for pool_name in {*expected, *selectors, DEFAULT_POOL}:
            assert store.nodes_in_pool(pool_name) == expected.get(pool_name, set())
