"""Reclaim over a tree of queues (arbiter.core.reclaim.tree, DESIGN §11):
nearest victims first, no subtree below its guarantee, the move rule where
taker and victim meet; played with admission (the tree engine) to the
fixpoint on random trees: it always gets there, and no allocation comes
back on the way (no loops)."""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbiter.core.model import ChildOrder, QueueSpec, Unit
from arbiter.core.reclaim.flat import Admitted, ReclaimQueue, Waiting, plan
from arbiter.core.reclaim.sim import Simulation
from arbiter.core.resources import EMPTY, Resources

CPU = Resources({"cpu": 1})
SETTINGS = settings(max_examples=int(os.environ.get("RECLAIM_EXAMPLES", "200")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def flood(simulation: Simulation, queue: str, count: int) -> None:
    for i in range(count):
        simulation.submit(Unit(f"{queue}/{i}", queue, CPU, created=float(i)))


def the_issue_tree() -> list[QueueSpec]:
    return [QueueSpec("p"), QueueSpec("p1", parent="p"), QueueSpec("p2", weight=3, parent="p"),
            QueueSpec("q")]


def test_the_issue_scenario_q_first_then_the_subtree() -> None:
    simulation = Simulation(Resources({"cpu": 10}), the_issue_tree())
    flood(simulation, "q", 10)
    simulation.admit()
    flood(simulation, "p1", 10)
    flood(simulation, "p2", 10)
    simulation.settle()
    counts = simulation.counts()
    assert simulation.converged
    assert counts["q"] == 5 and counts["p1"] + counts["p2"] == 5, counts
    assert counts["p1"] in (1, 2), counts
    assert all(m.victim == "q" for m in simulation.moves)  # only across the top level
    # Every order of arrival ends the same way.
    for first in ("p1", "p2"):
        again = Simulation(Resources({"cpu": 10}), the_issue_tree())
        flood(again, first, 10)
        again.admit()
        for name in ("q", "p1", "p2"):
            if name != first:
                flood(again, name, 10)
        again.settle()
        got = again.counts()
        assert got["q"] == 5 and got["p1"] in (1, 2) and got["p2"] in (3, 4), (first, got)


def running(*units: tuple[str, str]) -> list[Admitted]:
    return [Admitted(key, queue, CPU, admitted=float(i)) for i, (key, queue) in enumerate(units)]


def queues(*specs: ReclaimQueue) -> dict[str, ReclaimQueue]:
    return {spec.name: spec for spec in specs}


def test_siblings_are_taken_before_cousins() -> None:
    # a/{a1, a2}, b/{b1}; a1 waits. Both moves are allowed (a2 without one
    # unit, 1, is richer than a1's 0; b without one, 3, is richer than a's 2)
    # and b1's units are the newest (flat order would take b1/3): only
    # nearest-first makes a2, the sibling, give.
    tree = queues(ReclaimQueue("a"), ReclaimQueue("a1", parent="a"),
                  ReclaimQueue("a2", parent="a"), ReclaimQueue("b"),
                  ReclaimQueue("b1", parent="b"))
    units = running(("a2/0", "a2"), ("a2/1", "a2"),
                    *((f"b1/{i}", "b1") for i in range(4)))
    decided = plan(Resources({"cpu": 6}), tree, units,
                   {"a1": [Waiting("a1/0", "a1", CPU)]}, due={"a1"})
    assert [v.unit.key for v in decided.victims] == ["a2/1"]


def test_no_subtree_is_taken_below_its_guarantee() -> None:
    # Parent b guarantees 2 CPU to its subtree; b1 holds exactly that:
    # nothing of it goes, though b1 itself has no guarantee and is richer.
    tree = queues(ReclaimQueue("a"), ReclaimQueue("b", guarantee=Resources({"cpu": 2})),
                  ReclaimQueue("b1", parent="b"), ReclaimQueue("a1", parent="a"))
    units = running(("b1/0", "b1"), ("b1/1", "b1"))
    decided = plan(Resources({"cpu": 2}), tree, units,
                   {"a1": [Waiting("a1/0", "a1", CPU)]}, due={"a1"})
    assert decided.victims == ()


def test_the_rule_compares_subtrees_where_they_meet() -> None:
    # a/{a1, a2}, b/{b1}, 4 CPU: a2 holds 2 (its guarantee), b1 holds 2; a1 waits.
    # Flat, a1 (0) would take from b1 (2 -> 1). In the tree they meet at the
    # top, where a's subtree (2) is no poorer than b's without one (1): no move.
    def tree(guarantee: Resources) -> dict[str, ReclaimQueue]:
        return queues(ReclaimQueue("a"), ReclaimQueue("a1", parent="a"),
                      ReclaimQueue("a2", parent="a", guarantee=guarantee),
                      ReclaimQueue("b"), ReclaimQueue("b1", parent="b"))

    units = running(("a2/0", "a2"), ("a2/1", "a2"), ("b1/0", "b1"), ("b1/1", "b1"))
    wait = {"a1": [Waiting("a1/0", "a1", CPU)]}
    capacity = Resources({"cpu": 4})
    assert plan(capacity, tree(Resources({"cpu": 2})), units, wait, due={"a1"}).victims == ()
    flat = queues(*(ReclaimQueue(q.name, guarantee=q.guarantee)
                    for q in tree(Resources({"cpu": 2})).values()))
    assert [v.unit.queue for v in plan(capacity, flat, units, wait, due={"a1"}).victims] == ["b1"]
    # Without a2's guarantee its sibling gives way (2 -> 1 is richer than 0).
    took = plan(capacity, tree(EMPTY), units, wait, due={"a1"})
    assert [v.unit.queue for v in took.victims] == ["a2"]
    # And b1's sibling x meets b1 inside b: b1 (2 -> 1) is richer than x (0).
    inside = {**tree(EMPTY), "x": ReclaimQueue("x", parent="b")}
    got = plan(capacity, inside, units, {"x": [Waiting("x/0", "x", CPU)]}, due={"x"})
    assert [v.unit.queue for v in got.victims] == ["b1"]


def test_a_capped_parent_makes_room_inside_its_subtree() -> None:
    # Parent p is at its capability (2) with p1's units; p2 waits although
    # the cluster has room: only p1 can give way, and it does.
    tree = queues(ReclaimQueue("p", capability=Resources({"cpu": 2})),
                  ReclaimQueue("p1", parent="p"), ReclaimQueue("p2", parent="p"),
                  ReclaimQueue("q"))
    units = running(("p1/0", "p1"), ("p1/1", "p1"), ("q/0", "q"), ("q/1", "q"), ("q/2", "q"))
    decided = plan(Resources({"cpu": 8}), tree, units,
                   {"p2": [Waiting("p2/0", "p2", CPU)]}, due={"p2"})
    assert [v.unit.queue for v in decided.victims] == ["p1"]


# -- random trees: a fixpoint, and no allocation twice --------------------------------


@st.composite
def trees(draw: st.DrawFn) -> tuple[Resources, list[QueueSpec], list[list[Unit]]]:
    capacity = Resources({"cpu": draw(st.integers(4, 12)), "memory": draw(st.integers(4, 12))})
    specs: list[QueueSpec] = []
    leaves: list[str] = []

    def grow(name: str, parent: str | None, depth: int) -> None:
        least = 1 if name == "a" else 0  # some queue has a parent: a tree
        children = draw(st.integers(least, 3)) if depth < 3 else 0
        guarantee = (Resources({"cpu": draw(st.integers(1, 2))})
                     if draw(st.integers(0, 4)) == 0 else EMPTY)
        capability = (Resources({"cpu": draw(st.integers(2, 8))})
                      if children and draw(st.integers(0, 2)) == 0 else EMPTY)
        order: ChildOrder = "Queue" if children and draw(st.integers(0, 5)) == 0 else "Fair"
        specs.append(QueueSpec(name, weight=draw(st.integers(1, 4)), guarantee=guarantee,
                               capability=capability, parent=parent, child_order=order))
        for i in range(children):
            grow(f"{name}{i}", name, depth + 1)
        if not children:
            leaves.append(name)

    for top in "abc"[: draw(st.integers(1, 3))]:
        grow(top, None, 1)
    mixed = draw(st.booleans())
    shapes = [CPU] if not mixed else [CPU, Resources({"cpu": 1, "memory": 2}),
                                      Resources({"memory": 1})]
    order = draw(st.permutations(leaves))
    batches = [[Unit(f"{leaf}/{i}", leaf, draw(st.sampled_from(shapes)), created=float(i))
                for i in range(draw(st.integers(1, 8)))] for leaf in order]
    return capacity, specs, batches


def admitted(simulation: Simulation) -> frozenset[str]:
    return frozenset(u.key for name in simulation.queues
                     for u in simulation.engine.admitted(name))


def test_random_trees_reach_a_fixpoint_without_loops() -> None:
    seen: Counter[str] = Counter()

    @SETTINGS
    @given(trees())
    def check(case: tuple[Resources, list[QueueSpec], list[list[Unit]]]) -> None:
        capacity, specs, batches = case
        seen["examples"] += 1
        simulation = Simulation(capacity, specs)
        for batch in batches:
            for unit in batch:
                simulation.submit(unit)
            simulation.admit()
            states = {admitted(simulation)}
            for _ in range(500):
                if not simulation.reclaim_round():
                    break
                simulation.admit()
                seen["rounds"] += 1
                now = admitted(simulation)
                assert now not in states, "an allocation came back: a loop"
                states.add(now)
            else:
                raise AssertionError("no fixpoint after 500 rounds")
        if simulation.moves:
            seen["victims"] += 1
        for move in simulation.moves:
            parent = {s.name: s.parent for s in specs}
            seen["sibling moves" if parent[move.taker] == parent[move.victim]
                 else "other moves"] += 1

    check()
    print(dict(seen))
    assert seen["victims"] * 8 >= seen["examples"], seen  # reclaim is exercised
    assert seen["sibling moves"] and seen["other moves"], seen
