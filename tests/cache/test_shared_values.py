"""Records of many pods and units share what they repeat: equal requests,
pod sets and names are kept once however often a watch decodes them
(100,000 pending units in the loop benchmark: the store 40 % smaller)."""

from __future__ import annotations

import orjson

from arbiter.cache.convert import pod_from_api, shared, unit_from_api
from arbiter.core.resources import Resources


def _decoded(obj: dict[str, object]) -> dict[str, object]:
    """A fresh copy, as each watch event brings one."""
    value: dict[str, object] = orjson.loads(orjson.dumps(obj))
    return value


def _pod(name: str, cpu: str = "1") -> dict[str, object]:
    return _decoded({
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                     "labels": {"arbiter.dev/queue": "team-a"}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Pending"}})


def _unit(name: str, cpu: str = "1") -> dict[str, object]:
    return _decoded({
        "metadata": {"name": name, "namespace": "team-a", "uid": f"unit-{name}"},
        "spec": {"queue": "team-a", "consumerRef": {"kind": "Pod", "name": name, "uid": "u"},
                 "podSets": [{"name": "main", "count": 1, "requests": {"cpu": cpu}}]}})


def test_equal_requests_pod_sets_and_names_are_one_object() -> None:
    a, b = pod_from_api(_pod("a")), pod_from_api(_pod("b"))
    assert a.requests is b.requests and a.namespace is b.namespace
    assert a.queue is b.queue and a.phase is b.phase
    x, y = unit_from_api(_unit("x")), unit_from_api(_unit("y"))
    assert x.pod_sets is y.pod_sets and x.queue is y.queue and x.namespace is y.namespace
    assert x.consumer is not None and y.consumer is not None
    assert x.consumer.kind is y.consumer.kind


def test_different_values_stay_apart() -> None:
    a, big = pod_from_api(_pod("a")), pod_from_api(_pod("big", cpu="2"))
    assert a.requests == Resources({"cpu": 1000}) and big.requests == Resources({"cpu": 2000})
    x, y = unit_from_api(_unit("x")), unit_from_api(_unit("y", cpu="500m"))
    assert x.pod_sets != y.pod_sets
    assert y.pod_sets[0].requests == Resources({"cpu": 500})


def test_sharing_is_bounded() -> None:
    """A tenant's flood of distinct values cannot grow the table for ever."""
    from arbiter.cache import convert

    for index in range(convert._SHARED_LIMIT + 10):
        shared(("flood", index))
    assert len(convert._SHARED) <= convert._SHARED_LIMIT
