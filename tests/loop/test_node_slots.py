"""`NodeModel._unbound_slots` keeps a unit's answer while its plan, unit and
placed pods are the ones it was worked out from, and only then."""

from __future__ import annotations

from arbiter.cache.records import PodRecord
from arbiter.core.model import Placement, PodSet, Unit
from arbiter.core.resources import Resources
from arbiter.loop.nodes import NodeModel

CPU = Resources.parse({"cpu": "1"})


def _pod(uid: str, node: str) -> PodRecord:
    return PodRecord(uid, "ns", uid, requests=CPU, node_name=node, phase="Running")


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
    model.charge("a0", "ns/a", _pod("a0", "n0"))  # a's first pod seen bound where planned
    assert slots() == {"n1": {"ns/a", "ns/b"}}
    model.charge("a1", "ns/a", _pod("a1", "n2"))  # its second off plan: followed there
    assert slots() == {"n1": {"ns/b"}}
    model.charge("a1", "ns/a", None)  # gone: its slot is unbound again
    assert slots() == {"n1": {"ns/a", "ns/b"}}
    model.charge("a1", "ns/a", _pod("a1", "n2"))
    assert slots() == {"n1": {"ns/b"}}
    engine.by_key["ns/b"] = Placement("", {"main": ("n3", "n3")})  # replanned: a new object
    assert slots() == {"n3": {"ns/b"}}
    del engine.by_key["ns/b"]
    assert slots() == {}
    units["ns/a"] = Unit("ns/a", "q", CPU.scale(3), pods=(PodSet("main", 3, CPU),))
    engine.by_key["ns/a"] = Placement("", {"main": ("n0", "n1", "n4")})
    # Bound at n0 and n2: one pod left to place, at the first planned node free.
    assert slots() == {"n1": {"ns/a"}}


def test_slots_see_a_pod_turn_stale_and_back() -> None:
    """A unit admitted again while its old pods still stand: those pods
    turn stale (its new plan does not follow them), and the slot they held
    is unbound again; when they stay past the grace, they count again."""
    engine = Plans()
    model = NodeModel(lambda: engine)  # type: ignore[arg-type, return-value]
    unit = Unit("ns/a", "q", CPU.scale(2), pods=(PodSet("main", 2, CPU),))
    engine.by_key = {"ns/a": Placement("", {"main": ("n0", "n1")})}

    def slots() -> dict[str, set[str]]:
        return model._unbound_slots(engine, {"ns/a": unit}.get)  # type: ignore[arg-type]

    model.charge("a0", "ns/a", _pod("a0", "n0"))
    assert slots() == {"n1": {"ns/a"}}
    model.set_leaving({"ns/a"})  # taken back ...
    model.planned("ns/a", True)  # ... and admitted again before a0 left: a0 is stale
    assert slots() == {"n0": {"ns/a"}, "n1": {"ns/a"}}
    model.expire_stale(now=0.0, ttl=5.0)
    model.expire_stale(now=10.0, ttl=5.0)  # never deleted: the unit's after all
    assert slots() == {"n1": {"ns/a"}}
