"""Loop against engine (issue 26): random clusters played through the real
admission loop settle where the offline engine (`arbiter fairshare --from`)
says, queue for queue. See `tests.reclaim.parity`.

`PARITY_EXAMPLES` sets the number of examples (default 500)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reclaim.parity import Case, Job, play

SETTINGS = settings(max_examples=int(os.environ.get("PARITY_EXAMPLES", "500")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

LEAVES_FLAT = ("a", "b", "c", "d")


@st.composite
def cases(draw: st.DrawFn, *, tree: bool | None = None) -> Case:
    nodes = tuple(draw(st.lists(st.tuples(st.sampled_from(("1", "2", "4")),
                                          st.sampled_from(("x", "y"))),
                                min_size=1, max_size=6)))
    cpus = sum(int(cpu) for cpu, _ in nodes)
    pools = ({"px": "x", "py": "y"} if draw(st.booleans()) else {})
    if tree is None:
        tree = draw(st.booleans())
    queues: dict[str, dict[str, Any]] = {}
    if tree:
        queues["p"] = {}
        leaves = ["p1", "p2", "q"] + (["r"] if draw(st.booleans()) else [])
    else:
        leaves = list(LEAVES_FLAT[: draw(st.integers(2, 4))])
    room = cpus
    for name in leaves:
        spec: dict[str, Any] = {"weight": draw(st.integers(1, 5))}
        if name in ("p1", "p2"):
            spec["parent"] = "p"
        guarantee = draw(st.integers(0, min(3, room)))
        if guarantee:
            spec["guarantee"] = {"cpu": str(guarantee)}
            room -= guarantee
        if draw(st.integers(0, 4)) == 0:
            spec["capability"] = {"cpu": str(draw(st.integers(1, 4)))}
        if pools and draw(st.integers(0, 2)) == 0:
            spec["pools"] = [draw(st.sampled_from(sorted(pools)))]
        queues[name] = spec
    if tree and draw(st.booleans()):
        queues["p"] = {"weight": draw(st.integers(1, 3))}
    jobs = tuple(draw(st.lists(
        st.builds(Job, st.sampled_from(leaves), st.sampled_from(("500m", "1", "1", "2")),
                  st.sampled_from((1, 1, 2))),
        min_size=2, max_size=20)))
    return Case(nodes, queues, jobs, pools)


def check(case: Case) -> None:
    outcome = asyncio.run(play(case))
    assert outcome.loop == outcome.engine, outcome


@SETTINGS
@given(cases())
def test_the_loop_settles_where_the_engine_does(case: Case) -> None:
    check(case)
