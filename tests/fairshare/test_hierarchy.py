"""Hierarchical queues (DESIGN §11): the engine against the plain reference,
on random trees up to depth 4, and the §11 examples by hand."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbiter.core.deserved import deserved, hierarchical_deserved
from arbiter.core.engine.flat import admission_order
from arbiter.core.engine.tree import HierarchicalEngine, has_hierarchy
from arbiter.core.model import QueueSpec, Unit
from arbiter.core.resources import EMPTY, Resources
from tests.fairshare.gen import RESOURCES, Case, cases
from tests.fairshare.hierarchy_reference import hierarchical_order

MAX_DEPTH = 4


def run(case: Case) -> tuple[HierarchicalEngine, list[Unit]]:
    engine = HierarchicalEngine(case.capacity, case.queues)
    for unit in case.admitted:
        engine.add_admitted(unit)
    for unit in case.pending:
        engine.add_pending(unit)
    return engine, engine.admit_all()


def keys(units: list[Unit]) -> list[str]:
    return [unit.key for unit in units]


@st.composite
def trees(draw: st.DrawFn, max_queues: int = 9, max_units: int = 24) -> Case:
    """A random tree of queues (depth <= 4): capabilities and guarantees at
    every level, blocking leaves, Fair and Queue parents, mixed unit sizes;
    now and then a unit for a parent, for an unknown queue, or a queue whose
    parent does not exist."""
    count = draw(st.integers(1, max_queues))
    small = st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 6)).map(Resources)
    caps = st.one_of(st.just(EMPTY),
                     st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 12)).map(Resources))
    depth: dict[str, int] = {}
    queues: list[QueueSpec] = []
    for i in range(count):
        name = f"q{i}"
        choices = [None, *(q for q in depth if depth[q] < MAX_DEPTH)]
        parent = draw(st.sampled_from(choices))
        if draw(st.integers(0, 30)) == 0:
            parent = "ghost"
        depth[name] = 1 if parent is None or parent == "ghost" else depth[parent] + 1
        queues.append(QueueSpec(
            name=name,
            weight=draw(st.integers(1, 3)),
            guarantee=draw(st.one_of(st.just(EMPTY), small)),
            capability=draw(caps),
            blocking=draw(st.integers(0, 3)) == 0,
            policy=draw(st.sampled_from(("Priority", "FIFO"))),
            parent=parent,
            child_order=draw(st.sampled_from(("Fair", "Fair", "Queue"))),
        ))
    names = [q.name for q in queues]
    demands = st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 4)).map(Resources)
    nunits = draw(st.integers(0, max_units))
    units = [
        Unit(key=f"u{i}", queue=draw(st.sampled_from([*names, "zz"])),
             demand=draw(demands), priority=draw(st.integers(0, 2)),
             created=float(draw(st.integers(0, 5))))
        for i in range(nunits)
    ]
    capacity = Resources({"cpu": draw(st.integers(0, 16)), "memory": draw(st.integers(0, 16)),
                          "gpu": draw(st.sampled_from((0, 1, 2, 4)))})
    admitted = draw(st.integers(0, min(3, nunits)))
    return Case(capacity, queues, units[admitted:], units[:admitted])


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_engine_agrees_with_the_reference_on_random_trees(case: Case) -> None:
    _, order = run(case)
    assert keys(order) == keys(
        hierarchical_order(case.capacity, case.queues, case.pending, case.admitted))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_a_flat_set_of_queues_gives_exactly_section_4(case: Case) -> None:
    _, order = run(case)
    assert keys(order) == keys(
        admission_order(case.capacity, case.queues, case.pending, case.admitted))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(), st.data())
def test_changes_between_decisions_agree_with_a_fresh_reference(case: Case,
                                                                 data: st.DataObject) -> None:
    """Admit part, release some, add more: the rest follows the reference
    from the state reached."""
    engine = HierarchicalEngine(case.capacity, case.queues)
    for unit in case.admitted:
        engine.add_admitted(unit)
    half = len(case.pending) // 2
    for unit in case.pending[:half]:
        engine.add_pending(unit)
    first = [engine.next() for _ in range(data.draw(st.integers(0, 4)))]
    admitted = list(case.admitted) + [u for u in first if u is not None]
    released = data.draw(st.lists(st.sampled_from(admitted), unique=True, max_size=2)
                         if admitted else st.just([]))
    for unit in released:
        engine.release(unit.key)
    for unit in case.pending[half:]:
        engine.add_pending(unit)
    still = [u for u in admitted if u not in released]
    pending = [u for u in case.pending if engine.is_pending(u.key)]
    expected = hierarchical_order(case.capacity, case.queues, pending, still)
    assert keys(engine.admit_all()) == keys(expected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(), st.data())
def test_capacity_and_spec_changes_between_decisions(case: Case, data: st.DataObject) -> None:
    """A new capacity or a changed queue (weight, capability, parent order)
    mid-way: the rest follows the reference from the state reached."""
    engine = HierarchicalEngine(case.capacity, case.queues)
    for unit in case.pending:
        engine.add_pending(unit)
    done = [engine.next() for _ in range(data.draw(st.integers(0, 3)))]
    capacity = Resources({"cpu": data.draw(st.integers(0, 16)), "memory": 12, "gpu": 2})
    engine.set_capacity(capacity)
    queues = list(case.queues)
    at = data.draw(st.integers(0, len(queues) - 1))
    queues[at] = dataclasses.replace(
        queues[at], weight=data.draw(st.integers(1, 4)), capability=EMPTY,
        child_order=data.draw(st.sampled_from(("Fair", "Queue"))))
    engine.add_queue(queues[at])
    admitted = [u for u in done if u is not None]
    pending = [u for u in case.pending if engine.is_pending(u.key)]
    assert keys(engine.admit_all()) == keys(hierarchical_order(capacity, queues, pending, admitted))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_never_over_capacity_or_any_capability_on_the_path(case: Case) -> None:
    case.admitted = []
    engine, order = run(case)
    used = sum((u.demand for u in order), Resources())
    assert used.fits_in(case.capacity)
    for spec in case.queues:
        assert engine.subtree_allocated(spec.name).within_caps(spec.capability), spec.name
        if engine.children(spec.name):
            assert engine.admitted_count(spec.name) == 0


def _cpu(n: int) -> Resources:
    return Resources({"cpu": n})


def _flood(queue: str, n: int, start: int = 0) -> list[Unit]:
    return [Unit(f"{queue}-{i}", queue, _cpu(1), created=float(start + i)) for i in range(n)]


def test_parent_with_weighted_children_and_a_top_level_peer() -> None:
    """The issue's sandbox scenario, without reclaim: P (1) with P1 (1), P2 (3),
    and Q (1) on 10 CPUs: Q 5, P's subtree 5 split by weight (P2 gets 3-4)."""
    queues = [QueueSpec("P"), QueueSpec("P1", parent="P"), QueueSpec("P2", weight=3, parent="P"),
              QueueSpec("Q")]
    engine = HierarchicalEngine(_cpu(10), queues)
    for unit in _flood("Q", 10) + _flood("P1", 10) + _flood("P2", 10):
        engine.add_pending(unit)
    engine.admit_all()
    assert engine.allocated("Q") == _cpu(5)
    assert engine.subtree_allocated("P") == _cpu(5)
    assert engine.allocated("P1") + engine.allocated("P2") == _cpu(5)
    assert engine.allocated("P2").get_amount("cpu") in (3, 4)
    assert has_hierarchy(queues) and not has_hierarchy([QueueSpec("Q")])


def test_a_parents_capability_caps_its_subtree_and_its_guarantee_sums_its_childrens() -> None:
    queues = [QueueSpec("P", capability=_cpu(3)), QueueSpec("A", parent="P", guarantee=_cpu(2)),
              QueueSpec("B", parent="P"), QueueSpec("Q", weight=100, capability=_cpu(5))]
    engine = HierarchicalEngine(_cpu(10), queues)
    for unit in _flood("A", 5) + _flood("B", 5) + _flood("Q", 10):
        engine.add_pending(unit)
    order = keys(engine.admit_all())
    # A's guarantee counts for P at the top: its first two units come first.
    assert order[:2] == ["A-0", "A-1"]
    assert engine.subtree_allocated("P") == _cpu(3)
    assert engine.allocated("Q") == _cpu(5)


def test_child_order_queue_orders_the_subtree_as_one_queue_with_child_quotas() -> None:
    queues = [QueueSpec("P", policy="FIFO", child_order="Queue"),
              QueueSpec("A", parent="P", capability=_cpu(2)), QueueSpec("B", parent="P")]
    engine = HierarchicalEngine(_cpu(6), queues)
    units = [Unit("a0", "A", _cpu(1), created=0), Unit("a1", "A", _cpu(1), created=1),
             Unit("a2", "A", _cpu(1), created=2), Unit("b0", "B", _cpu(1), created=3),
             Unit("b1", "B", _cpu(1), created=4)]
    for unit in units:
        engine.add_pending(unit)
    assert keys(engine.admit_all()) == ["a0", "a1", "b0", "b1"]  # a2: over A's capability


def test_work_of_a_parent_or_a_detached_queue_is_never_admitted() -> None:
    queues = [QueueSpec("P"), QueueSpec("A", parent="P"), QueueSpec("X", parent="ghost"),
              QueueSpec("C1", parent="C2"), QueueSpec("C2", parent="C1")]
    engine = HierarchicalEngine(_cpu(10), queues)
    for queue in ("P", "X", "C1", "A"):
        engine.add_pending(Unit(f"{queue}-0", queue, _cpu(1)))
    assert keys(engine.admit_all()) == ["A-0"]


def test_hierarchical_deserved_fills_each_level_by_the_flat_rule() -> None:
    queues = [QueueSpec("P"), QueueSpec("P1", parent="P"), QueueSpec("P2", weight=3, parent="P"),
              QueueSpec("Q"), QueueSpec("X", parent="ghost")]
    demand = {name: _cpu(10) for name in ("P1", "P2", "Q", "X")}
    fair = hierarchical_deserved(_cpu(12), queues, demand)
    assert fair["Q"] == fair["P"] == _cpu(6)
    # P's 6 split 1 : 3 -> 1.5 and 4.5, floored to whole amounts.
    assert (fair["P1"], fair["P2"]) == (_cpu(1), _cpu(4))
    assert fair["X"] == EMPTY


def test_hierarchical_deserved_of_a_flat_set_is_the_flat_one() -> None:
    queues = [QueueSpec("A", weight=2, guarantee=_cpu(1)), QueueSpec("B", capability=_cpu(2))]
    demand = {"A": _cpu(9), "B": _cpu(9)}
    assert hierarchical_deserved(_cpu(10), queues, demand) == deserved(_cpu(10), queues, demand)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_hierarchical_deserved_splits_each_parents_share_among_its_children(case: Case) -> None:
    demand: dict[str, Resources] = {}
    for unit in case.pending:
        demand[unit.queue] = demand.get(unit.queue, EMPTY) + unit.demand
    fair = hierarchical_deserved(case.capacity, case.queues, demand)
    specs = {spec.name: spec for spec in case.queues}
    children: dict[str | None, list[str]] = {}
    for spec in case.queues:
        children.setdefault(spec.parent, []).append(spec.name)

    def subtree_demand(name: str) -> Resources:
        total = demand.get(name, EMPTY)
        for child in children.get(name, []):
            total = total + subtree_demand(child)
        return total

    top = sum((fair[name] for name in children.get(None, [])), Resources())
    assert top.fits_in(case.capacity)
    reached: list[str] = list(children.get(None, []))
    for name in reached:  # grows while walking: every queue reachable from the top
        reached.extend(children.get(name, []))
    for name, spec in specs.items():
        if name not in reached:
            assert fair[name] == EMPTY, name  # broken chain of parents: never admitted
            continue
        assert fair[name].fits_in(subtree_demand(name)), name
        assert fair[name].within_caps(spec.capability), name
        kids = children.get(name, [])
        if kids:
            assert sum((fair[k] for k in kids), Resources()).fits_in(fair[name]), name
