"""Partial admission in the engine (DESIGN §12): a unit whose pod sets carry
minCount is admitted with the largest count >= minCount that fits, node fit
included, once every unit that fits whole is admitted."""

from __future__ import annotations

import random
import re

import pytest

from arbiter.cli.fairshare_scenario import ScenarioError, evaluate, load_scenario
from arbiter.core.engine.flat import AdmissionEngine
from arbiter.core.model import Node, PodSet, QueueSpec, Unit, demand_of
from arbiter.core.partial import admit_partial, can_shrink, smaller
from arbiter.core.resources import Resources


def cpu(millis: int) -> Resources:
    return Resources({"cpu": millis})


def unit(key: str, queue: str, pods: int, minimum: int | None, millis: int = 1000,
         created: float = 0.0) -> Unit:
    sets = (PodSet("main", pods, cpu(millis), minimum),)
    return Unit(key, queue, demand_of(sets), created=created, pods=sets)


def nodes(count: int, millis: int = 1000) -> list[Node]:
    return [Node(f"n{i}", allocatable=cpu(millis)) for i in range(count)]


def engine_on(queues: list[QueueSpec], cluster: list[Node]) -> AdmissionEngine:
    """An engine whose capacity is its nodes' free room (as the loop gives it)."""
    total = sum(n.allocatable.get_amount("cpu") - n.used.get_amount("cpu") for n in cluster)
    return AdmissionEngine(cpu(total), queues, cluster)


def admit(engine: AdmissionEngine, pending: list[Unit]) -> dict[str, int]:
    for u in pending:
        engine.add_pending(u)
    chosen = engine.admit_all()
    chosen += admit_partial(engine, [u for u in pending if can_shrink(u)])
    return {u.key: sum(ps.count for ps in u.pods) for u in chosen}


def test_the_largest_count_that_fits_on_nodes() -> None:
    engine = engine_on([QueueSpec("a")], nodes(5))
    assert admit(engine, [unit("a/wide", "a", 8, 3)]) == {"a/wide": 5}
    assert engine.allocated("a") == cpu(5000)
    plan = engine.plan("a/wide")
    assert plan is not None and sorted(plan.nodes["main"]) == [f"n{i}" for i in range(5)]


def test_never_below_min_count_and_never_without_it() -> None:
    engine = engine_on([QueueSpec("a")], nodes(5))
    assert admit(engine, [unit("a/picky", "a", 8, 6), unit("a/whole", "a", 8, None)]) == {}
    assert engine.is_pending("a/picky") and engine.is_pending("a/whole")
    assert engine.pending("a")[0].pods[0].count == 8  # left whole


def test_node_fit_decides_not_the_aggregate() -> None:
    # 3 nodes of 2 CPUs hold one 1.5-CPU pod each: 4.5 CPUs free in total
    # would take 4 such pods, the nodes take 3.
    engine = engine_on([QueueSpec("a")], nodes(3, 2000))
    assert admit(engine, [unit("a/big", "a", 5, 1, millis=1500)]) == {"a/big": 3}


def test_without_nodes_the_capacity_decides() -> None:
    engine = AdmissionEngine(cpu(9000), [QueueSpec("a")])
    assert admit(engine, [unit("a/u", "a", 10, 1)]) == {"a/u": 9}


def test_whole_units_of_every_queue_first_then_the_shrunk_one() -> None:
    engine = engine_on([QueueSpec("a"), QueueSpec("b")], nodes(6))
    got = admit(engine, [unit("a/wide", "a", 8, 2, created=0), unit("b/small", "b", 2, None,
                                                                      created=1)])
    assert got == {"b/small": 2, "a/wide": 4}


def test_capability_bounds_the_count() -> None:
    engine = engine_on([QueueSpec("a", capability=cpu(3000))], nodes(8))
    assert admit(engine, [unit("a/u", "a", 8, 2)]) == {"a/u": 3}


def test_smaller_takes_one_pod_from_every_set_above_its_minimum() -> None:
    sets = (PodSet("w", 4, cpu(1000), 2), PodSet("ps", 2, cpu(500)), PodSet("x", 3, cpu(1), 2))
    start = Unit("k", "q", demand_of(sets), pods=sets)
    counts = [tuple(ps.count for ps in u.pods) for u in smaller(start)]
    assert counts == [(3, 2, 2), (2, 2, 2)]
    assert [u.demand for u in smaller(start)][-1] == demand_of(
        (PodSet("w", 2, cpu(1000)), PodSet("ps", 2, cpu(500)), PodSet("x", 2, cpu(1))))
    assert list(smaller(unit("k", "q", 3, 3))) == [] and not can_shrink(unit("k", "q", 3, 3))


def test_matches_trying_every_count_on_a_fresh_engine() -> None:
    """Exactness: the count chosen is the largest c in [minCount, count]
    for which a unit of c pods alone is admitted on the same cluster."""
    rng = random.Random(16)
    for _ in range(60):
        sizes = [rng.choice((1000, 2000, 3000)) for _ in range(rng.randint(1, 5))]
        used = [rng.choice((0, 500, 1000)) for _ in sizes]
        cluster = [Node(f"n{i}", allocatable=cpu(size), used=cpu(min(size, taken)))
                   for i, (size, taken) in enumerate(zip(sizes, used, strict=True))]
        pods, millis = rng.randint(1, 9), rng.choice((500, 1000, 1500))
        minimum = rng.randint(1, pods)
        engine = engine_on([QueueSpec("a")], cluster)
        got = admit(engine, [unit("a/u", "a", pods, minimum, millis)]).get("a/u")
        expected = None
        for count in range(pods, minimum - 1, -1):
            fresh = engine_on([QueueSpec("a")], cluster)
            fresh.add_pending(unit("a/u", "a", count, None, millis))
            if fresh.admit_all():
                expected = count
                break
        assert got == expected, (sizes, used, pods, minimum, millis)


def test_fairshare_scenario_accepts_min_count_per_unit() -> None:
    document = {
        "nodes": [{"name": "n", "allocatable": {"cpu": "1"}, "count": 5}],
        "queues": [{"name": "a", "units": [
            {"name": "wide", "pods": 8, "minCount": 3, "requests": {"cpu": "1"}}]},
                   {"name": "b", "units": [{"pods": 8, "requests": {"cpu": "1"}}]}],
    }
    out = evaluate(load_scenario(document))
    assert out["queues"]["a"]["partial"] == {"a/wide": 5}
    assert out["queues"]["a"]["allocated"] == {"cpu": "5"}
    assert out["queues"]["b"]["admitted"] == 0 and "partial" not in out["queues"]["b"]


@pytest.mark.parametrize(("unit_entry", "field"), [
    ({"minCount": 2, "requests": {"cpu": "1"}}, "units[0].minCount: needs pods"),
    ({"pods": 2, "minCount": 3, "requests": {"cpu": "1"}}, "units[0].minCount: 3 is more"),
    ({"pods": 2, "minCount": 0, "requests": {"cpu": "1"}}, "units[0].minCount"),
])
def test_fairshare_scenario_refuses_a_bad_min_count(unit_entry: dict[str, object],
                                                    field: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(field)):
        load_scenario({"capacity": {"cpu": "4"},
                       "queues": [{"name": "a", "units": [unit_entry]}]})
