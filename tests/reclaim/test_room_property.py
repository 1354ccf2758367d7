"""Reclaim with node fit (DESIGN §10), pure: on random clusters, every unit a
pass serves can be placed on nodes of its queue's pools once its victims'
pods are gone (checked by an independent first-fit on plain dicts), and a
pass on a cluster without node trouble decides as before."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.core.engine.flat import AdmissionEngine
from arbiter.core.model import Node, Placement, PodSet, Pool, QueueSpec, Unit
from arbiter.core.reclaim.flat import Admitted, ReclaimQueue, Waiting, plan
from arbiter.core.reclaim.room import NodeRoom
from arbiter.core.resources import Resources
from tests.core.test_placement import (
    Free,
    capacity_of,
    node_free,
    pods_of,
    pool_nodes,
    random_cluster,
    room,
)


def place(pods: list[tuple[str, Resources]], names: list[str],
          free: Free) -> dict[str, dict[str, int]] | None:
    """First fit of `pods` (in order) on `names`: the amounts taken per node."""
    left = {n: dict(free[n]) for n in names}
    taken: dict[str, dict[str, int]] = {}
    for _, pod in pods:
        for n in names:
            if room(left[n], pod):
                for r, v in pod.items():
                    left[n][r] = left[n].get(r, 0) - v
                    taken.setdefault(n, {})[r] = taken.get(n, {}).get(r, 0) + v
                break
        else:
            return None
    return taken if names or not pods else None


def holdings(unit: Unit, placement: Placement) -> list[tuple[str, Resources]]:
    requests = {ps.name: ps.requests for ps in unit.pods} or {"main": unit.demand}
    return [(node, requests[name]) for name, nodes in placement.nodes.items()
            for node in nodes]


def add(free: Free, node: str, amounts: Mapping[str, int], sign: int) -> None:
    for r, v in amounts.items():
        free[node][r] = free[node].get(r, 0) + sign * v


def crowded(rng: random.Random) -> tuple[list[Node], list[Pool], list[QueueSpec], list[Unit]]:
    """Random nodes filled by small units of one queue; then the others
    arrive with larger pods, some confined to pools or a zone."""
    nodes, pools, queues, _ = random_cluster(rng)
    queues = [QueueSpec("rich"), *queues]
    units: list[Unit] = []
    room_total = sum(n.allocatable.get_amount("cpu") for n in nodes)
    for i in range(rng.randint(1, max(1, room_total))):
        each = Resources({"cpu": rng.randint(1, 2), "memory": rng.randint(0, 1)})
        count = rng.choice((1, 1, 2))
        units.append(Unit(f"r{i}", "rich", each.scale(count), priority=rng.randint(0, 1),
                          created=float(i), pods=(PodSet("main", count, each),)))
    for i in range(rng.randint(1, 6)):
        each = Resources({"cpu": rng.randint(1, 5), "memory": rng.randint(0, 3)})
        count = rng.randint(1, 3)
        units.append(Unit(f"w{i}", rng.choice(queues[1:]).name, each.scale(count),
                          priority=rng.randint(0, 1), created=float(100 + i),
                          pods=(PodSet("main", count, each),)))
    return nodes, pools, queues, units


def settled(seed: int) -> tuple[AdmissionEngine, list[Node], list[QueueSpec], dict[str, Unit]]:
    """A random cluster with a part of its units admitted and the rest waiting."""
    rng = random.Random(seed)
    nodes, pools, queues, units = (crowded if seed % 4 else random_cluster)(rng)
    engine = AdmissionEngine(capacity_of(nodes), queues, nodes, pools)
    half = len(units) // 2
    for unit in units[:half]:
        engine.add_pending(unit)
    engine.admit_all()
    for unit in units[half:]:
        engine.add_pending(unit)
    engine.admit_all()
    return engine, nodes, queues, {u.key: u for u in units}


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=400, deadline=None)
def test_every_unit_a_pass_serves_fits_on_nodes_once_its_victims_are_gone(seed: int) -> None:
    engine, nodes, queues, units = settled(seed)
    view = engine.node_view()
    assert view is not None
    specs = {q.name: q for q in queues}
    pools = engine._nodes.pools if engine._nodes is not None else []
    allowed = {q.name: [n for _, names in pool_nodes(nodes, pools, q) for n in names]
               for q in queues}
    plans = engine.plans()
    admitted = [Admitted(u.key, u.queue, u.demand, u.priority, float(i), u.created)
                for i, u in enumerate(units.values()) if engine.is_admitted(u.key)]
    waiting = {q.name: [Waiting(u.key, u.queue, u.demand, u.priority)
                        for u in engine.pending(q.name)] for q in queues}

    def usable(w: Waiting, victim: Admitted) -> bool:
        held = plans.get(victim.key)
        return held is not None and any(
            node in allowed[w.queue] for nodes in held.nodes.values() for node in nodes)

    reclaim_queues = {q.name: ReclaimQueue(q.name, q.weight, q.guarantee, q.capability)
                      for q in queues}
    pending = {u.key: u for q in queues for u in engine.pending(q.name)}
    decided = plan(engine.capacity(), reclaim_queues, admitted, waiting,
                   due=set(specs), usable=usable,
                   room=NodeRoom(view, pending, engine.capacity()))

    # The oracle: the nodes' free amounts with every plan counted, then the
    # pass replayed: each served unit's victims leave, then it is placed.
    free = node_free(nodes)
    for key, placement in plans.items():
        for node, amounts in holdings(units[key], placement):
            add(free, node, amounts, -1)
    for key in decided.served:
        for victim in decided.victims:
            if victim.for_unit == key:
                for node, amounts in holdings(units[victim.unit.key], plans[victim.unit.key]):
                    add(free, node, amounts, +1)
        unit = units[key]
        pods = pods_of(unit, engine.capacity())
        for _, names in pool_nodes(nodes, pools, specs[unit.queue]):
            taken = place(pods, names, free)
            if taken is not None:
                for node, took in taken.items():
                    add(free, node, took, -1)
                break
        else:
            raise AssertionError(f"{key} served but its pods fit on no node it may use "
                                 f"(victims {[v.unit.key for v in decided.victims]})")


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_without_node_trouble_the_room_changes_nothing(seed: int) -> None:
    """One node as large as the cluster: whatever fits in total fits on it,
    so a pass with the room decides exactly as one without."""
    _, nodes, confined, units = settled(seed)
    total = capacity_of(nodes)
    # Pools and selectors aside: on one node they could only confine to nothing.
    queues = [dataclasses.replace(q, pools=(), node_selector={}) for q in confined]
    big = AdmissionEngine(total, queues, [Node("all", {}, total)], [])
    for unit in units.values():
        big.add_pending(unit)
    big.admit_all()
    view = big.node_view()
    assert view is not None
    reclaim_queues = {q.name: ReclaimQueue(q.name, q.weight, q.guarantee, q.capability)
                      for q in queues}
    admitted = [Admitted(u.key, u.queue, u.demand, u.priority, float(i), u.created)
                for i, u in enumerate(units.values()) if big.is_admitted(u.key)]
    waiting = {q.name: [Waiting(u.key, u.queue, u.demand, u.priority)
                        for u in big.pending(q.name)] for q in queues}
    pending = {u.key: u for q in queues for u in big.pending(q.name)}
    plain = plan(big.capacity(), reclaim_queues, admitted, waiting, due=set(reclaim_queues))
    roomy = plan(big.capacity(), reclaim_queues, admitted, waiting, due=set(reclaim_queues),
                 room=NodeRoom(view, pending, big.capacity()))
    assert roomy == plain


def test_victims_spread_over_nodes_are_found_node_by_node() -> None:
    """40 nodes × 2 CPUs, each running two 1-CPU units of `rich`; in victim
    order consecutive victims never share a node (round-robin). A 2-CPU pod
    needs both units of one node: walking in victim order finds none within
    its bound, so the pass regroups the candidates node by node."""
    nodes = [Node(f"n{i:02d}", {}, Resources({"cpu": 2})) for i in range(40)]
    total = capacity_of(nodes)
    engine = AdmissionEngine(total, [QueueSpec("rich"), QueueSpec("poor")], nodes)
    for i in range(80):
        engine.add_pending(Unit(f"r{i:02d}", "rich", Resources({"cpu": 1}), created=float(i)))
    assert len(engine.admit_all()) == 80
    wide = Unit("w", "poor", Resources({"cpu": 2}), created=100.0)
    engine.add_pending(wide)
    plans = engine.plans()
    on = {key: placement.nodes["main"][0] for key, placement in plans.items()}
    # unit j of every node, then unit j + 1 (the earlier unit of a node is j = 0)
    rank = {key: (sorted(k for k in on if on[k] == node).index(key), node)
            for key, node in on.items()}
    admitted = sorted((Admitted(u.key, u.queue, u.demand, 0, u.created, u.created)
                       for u in engine.admitted("rich")), key=lambda u: rank[u.key])
    queues = {"rich": ReclaimQueue("rich"), "poor": ReclaimQueue("poor")}
    waiting = {"poor": [Waiting("w", "poor", wide.demand)]}
    view = engine.node_view()
    assert view is not None
    blind = plan(total, queues, admitted, waiting, due={"poor"}, ordered=True)
    assert len({on[v.unit.key] for v in blind.victims}) == 2  # total only: two nodes
    decided = plan(total, queues, admitted, waiting, due={"poor"}, ordered=True,
                   room=NodeRoom(view, {"w": wide}, total))
    assert decided.served == ("w",)
    chosen = [v.unit.key for v in decided.victims]
    assert len(chosen) == 2 and on[chosen[0]] == on[chosen[1]], chosen
    for key in chosen:
        engine.release(key)
    assert engine.next() == wide and engine.plan("w") is not None
