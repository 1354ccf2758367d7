"""Node fit on clusters larger than one word of live bits (64 nodes), held
to the independent oracle of `test_placement`: the floor and its live bits,
the per-pod cursors and the lazy re-check of queues woken by released room
all take part."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbiter.core.model import Node, PodSet, Pool, QueueSpec, Unit
from arbiter.core.resources import EMPTY, Resources
from tests.core.test_placement import play


def many_nodes_cluster(
    rng: random.Random,
) -> tuple[list[Node], list[Pool], list[QueueSpec], list[Unit]]:
    nodes = [
        Node(
            f"n{i:03d}",
            {"zone": rng.choice("ab"), "kind": rng.choice(("gpu", "cpu"))},
            Resources({"cpu": rng.randint(0, 12), "memory": rng.randint(0, 12)}),
            Resources({"cpu": rng.randint(0, 3)}) if rng.random() < 0.2 else EMPTY,
        )
        for i in range(rng.randint(65, 200))
    ]
    pools = [Pool("gpu", {"kind": "gpu"})] if rng.random() < 0.5 else []
    queues = [
        QueueSpec(
            f"q{k}",
            weight=rng.choice((1, 2, 3)),
            guarantee=Resources({"cpu": rng.randint(0, 20)}) if rng.random() < 0.3 else EMPTY,
            blocking=rng.random() < 0.15,
            policy=rng.choice(("Priority", "FIFO")),
            node_selector={"zone": rng.choice("ab")} if rng.random() < 0.3 else {},
        )
        for k in range(rng.randint(3, 10))
    ]
    units = []
    for i in range(rng.randint(100, 300)):
        sets = tuple(
            PodSet(f"s{k}", rng.randint(1, 5),
                   Resources({r: rng.randint(1, 6) for r in ("cpu", "memory")
                              if rng.random() < 0.9}))
            for k in range(rng.choice((1, 1, 1, 2)))
        )
        demand = EMPTY
        for ps in sets:
            demand = demand + ps.requests.scale(ps.count)
        units.append(Unit(f"u{i}", rng.choice(queues).name, demand,
                          priority=rng.randint(0, 1), created=float(rng.randint(0, 40)),
                          pods=sets))
    return nodes, pools, queues, units


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32))
def test_many_nodes_admitted_units_fit_and_no_placeable_unit_waits(seed: int) -> None:
    rng = random.Random(seed)
    nodes, pools, queues, units = many_nodes_cluster(rng)
    play(rng, nodes, pools, queues, units, rounds=4, releases=lambda: rng.randint(1, 6),
         finish_unmanaged=False)
