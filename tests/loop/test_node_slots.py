"""`NodeModel._unbound_slots` keeps a unit's answer while its plan, unit and
placed pods are the ones it was worked out from, and only then."""

from __future__ import annotations

from arbiter.core.model import Placement, PodSet, Unit
from arbiter.core.resources import Resources
from arbiter.loop.nodes import NodeModel, _Bound

CPU = Resources.parse({"cpu": "1"})


class Plans:
    def __init__(self) -> None:
        self.by_key: dict[str, Placement] = {}

    def plans(self) -> dict[str, Placement]:
        return dict(self.by_key)


def test_slots_follow_bindings_replans_and_units_gone() -> None:
    engine = Plans()
    model = NodeModel(lambda: engine)  # type: ignore[arg-type, return-value]
    units = {key: Unit(key, "q", CPU.scale(2), pods=(PodSet("main", 2, CPU),))
             for key in ("ns/a", "ns/b")}
    engine.by_key = {"ns/a": Placement("", {"main": ("n0", "n1")}),
                     "ns/b": Placement("", {"main": ("n1", "n1")})}

    def slots() -> dict[str, set[str]]:
        return model._unbound_slots(engine, units.get)  # type: ignore[arg-type]

    assert slots() == {"n0": {"ns/a"}, "n1": {"ns/a", "ns/b"}}
    model._pods["a0"] = _Bound("ns/a", "n0", CPU)  # a's first pod seen bound where planned
    model._by_unit["ns/a"] = {"a0"}
    assert slots() == {"n1": {"ns/a", "ns/b"}}
    model._pods["a1"] = _Bound("ns/a", "n2", CPU)  # its second off plan: followed there
    model._by_unit["ns/a"].add("a1")
    assert slots() == {"n1": {"ns/b"}}
    engine.by_key["ns/b"] = Placement("", {"main": ("n3", "n3")})  # replanned: a new object
    assert slots() == {"n3": {"ns/b"}}
    del engine.by_key["ns/b"]
    assert slots() == {}
    units["ns/a"] = Unit("ns/a", "q", CPU.scale(3), pods=(PodSet("main", 3, CPU),))
    engine.by_key["ns/a"] = Placement("", {"main": ("n0", "n1", "n4")})
    # Bound at n0 and n2: one pod left to place, at the first planned node free.
    assert slots() == {"n1": {"ns/a"}}
