"""Partial admission (DESIGN §12): a unit whose pod sets carry `min_count`
may be admitted with fewer pods when all of them do not fit; the largest
count that fits (node fit included) is taken, never below `min_count`.

Played on top of the engine, with its own fit check: once progressive
filling admitted all it could, each unit that may shrink is offered to the
engine as a smaller copy under the same key (its pod sets' counts one step
lower each time), from the full count down to the minimum, until one is
admitted. So whole units of every queue go first, and a unit is shrunk only
as much as the room left requires.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from arbiter.core.engine import Engine
from arbiter.core.model import Unit, demand_of


def can_shrink(unit: Unit) -> bool:
    return any(ps.min_count is not None and ps.min_count < ps.count for ps in unit.pods)


def smaller(unit: Unit) -> Iterator[Unit]:
    """Copies of `unit` with fewer pods, largest first: each step takes one
    pod from every pod set still above its min_count."""
    counts = [ps.count for ps in unit.pods]
    floors = [ps.count if ps.min_count is None else max(0, min(ps.min_count, ps.count))
              for ps in unit.pods]
    while True:
        counts = [max(floor, count - 1) for count, floor in zip(counts, floors, strict=True)]
        pods = tuple(replace(ps, count=count) for ps, count in zip(unit.pods, counts, strict=True))
        if pods == unit.pods:
            return
        yield replace(unit, demand=demand_of(pods), pods=pods)
        if counts == floors:
            return
        unit = replace(unit, pods=pods)


def admit_partial(engine: Engine, candidates: Iterable[Unit]) -> list[Unit]:
    """Offer each pending candidate to `engine` with fewer pods, largest
    first; returns what the engine admitted meanwhile (the shrunk units, and
    any unit that got room because of them). A candidate none of whose
    smaller copies fits is left pending whole."""
    chosen: list[Unit] = []
    for unit in candidates:
        if not engine.is_pending(unit.key):
            continue
        for copy in smaller(unit):
            engine.add_pending(copy)  # replaces the pending unit of that key
            admitted = engine.admit_all()
            chosen.extend(admitted)
            if engine.is_admitted(unit.key):
                break
        else:
            engine.add_pending(unit)
    return chosen
