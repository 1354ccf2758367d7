"""A plain reference of DESIGN §11's admission order, written apart from the
engine (`arbiter.core.engine.tree`): every step rescans the whole tree from the
root, with exact fractions and no state kept between steps.

Read it next to §11:

* the subtree of a queue is the queue and everything below it; its allocation
  is the sum of the admitted units of every queue in it;
* a unit fits when it fits the free capacity and, for every queue on the path
  from its queue up to the top, subtree allocation + unit <= capability on
  every resource the unit requests that the capability names;
* a parent's guarantee is, per resource, the larger of its own and the sum of
  its children's (so a child's guarantee also counts one level up);
* a Fair node offers the offer of its best child: under guarantee first
  (subtree allocation + offered unit <= guarantee on every requested
  resource), then the lowest subtree dominant share / weight, then name;
* a leaf, and a `childOrder: Queue` parent (its whole subtree as one list, in
  the parent's policy), offers its first unit that fits; blocking: its head
  or nothing;
* a queue whose chain of parents is broken (missing parent, cycle) and a
  parent's own units are never admitted.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from arbiter.core.engine.flat import dominant_share_of, order_key
from arbiter.core.model import QueueSpec, Unit
from arbiter.core.resources import EMPTY, Resources


def hierarchical_order(
    capacity: Resources,
    queues: Iterable[QueueSpec],
    pending: Iterable[Unit],
    admitted: Iterable[Unit] = (),
) -> list[Unit]:
    """The units of `pending` in the order §11 admits them."""
    specs = {spec.name: spec for spec in queues}
    children: dict[str | None, list[str]] = {}
    for spec in specs.values():
        children.setdefault(spec.parent, []).append(spec.name)
    for names in children.values():
        names.sort()

    def chain(name: str) -> list[str] | None:
        """`name` and its ancestors, top last; None when the chain is broken."""
        out = [name]
        while specs[out[-1]].parent is not None:
            parent = specs[out[-1]].parent
            if parent not in specs or parent in out:
                return None
            out.append(parent)
        return out

    def subtree(name: str) -> list[str]:
        out = [name]
        for child in children.get(name, []):
            out.extend(subtree(child))
        return out

    def guarantee(name: str) -> Resources:
        total = EMPTY
        for child in children.get(name, []):
            total = total + guarantee(child)
        return total.maximum(specs[name].guarantee)

    own: dict[str, Resources] = {}
    used = EMPTY
    for unit in admitted:
        used = used + unit.demand
        own[unit.queue] = own.get(unit.queue, EMPTY) + unit.demand
    waiting = [u for u in pending
               if u.queue in specs and not children.get(u.queue) and chain(u.queue)]
    order: list[Unit] = []

    def alloc(name: str) -> Resources:
        total = EMPTY
        for member in subtree(name):
            total = total + own.get(member, EMPTY)
        return total

    def fits(unit: Unit) -> bool:
        if not unit.demand.fits_in(capacity - used):
            return False
        for name in chain(unit.queue) or []:
            cap = specs[name].capability
            held = alloc(name)
            for r, v in unit.demand.items():
                if r in cap and held.get_amount(r) + v > cap[r]:
                    return False
        return True

    def first_fitting(units: list[Unit], blocking: bool) -> Unit | None:
        for unit in units:
            if fits(unit):
                return unit
            if blocking:
                return None
        return None

    def offer(name: str) -> Unit | None:
        spec = specs[name]
        kids = children.get(name, [])
        if not kids or spec.child_order == "Queue":
            members = set(subtree(name))
            units = sorted((u for u in waiting if u.queue in members),
                           key=lambda u: order_key(u, spec.policy))
            return first_fitting(units, spec.blocking)
        return best_of(kids)

    def best_of(names: list[str]) -> Unit | None:
        best: tuple[tuple[bool, Fraction, str], Unit] | None = None
        for name in names:
            unit = offer(name)
            if unit is None:
                continue
            held = alloc(name)
            mine = guarantee(name)
            under = all(held.get_amount(r) + v <= mine.get_amount(r)
                        for r, v in unit.demand.items() if v > 0)
            key = (not under, dominant_share_of(held, capacity) / specs[name].weight, name)
            if best is None or key < best[0]:
                best = (key, unit)
        return None if best is None else best[1]

    tops = [name for name in children.get(None, []) if chain(name) is not None]
    while True:
        chosen = best_of(tops)
        if chosen is None:
            return order
        waiting.remove(chosen)
        own[chosen.queue] = own.get(chosen.queue, EMPTY) + chosen.demand
        used = used + chosen.demand
        order.append(chosen)
