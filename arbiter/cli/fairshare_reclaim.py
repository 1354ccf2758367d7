"""`arbiter fairshare` from a running allocation: what reclaim would do.

A queue of the scenario may list `running:` units (entries as in `units`:
`count`, `requests`, `priority`, `name`), or `--from FILE` gives them apart
as a mapping `{QUEUE: [entries]}` (YAML or JSON), so that one demand can be
tried from several allocations. Running units are admitted already, in the
order listed (the last one listed is the most recently admitted); they come
before the waiting `units` and count in the queue's demand.

From there the admission loop is played offline with every reclaim grace
passed (`arbiter.core.reclaim.sim`): admit what fits, pick victims by the
move rule, requeue them, again, until no move is left. The output is the
usual one for that fixpoint, plus

    "reclaim": {"moves": [{"round": 1, "taker": "B", "for": "B/unit-0-0",
                           "victim": "A", "unit": "A/running/unit-0-9",
                           "rule": "share"}, ...],
                "rounds": 2, "converged": true}

(`rule`: "share" — the victim's queue stays richer than the taker was —
or "guarantee" — the taker was under its guarantee.)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from arbiter.cli.fairshare_scenario import (
    Scenario,
    ScenarioError,
    evaluate,
    list_field,
    load_scenario,
    read_document,
)
from arbiter.core.engine.tree import has_hierarchy
from arbiter.core.model import Unit
from arbiter.core.reclaim.sim import Simulation

RUNNING = "running"

Entries = dict[str, tuple[str, list[Any]]]  # queue -> (field for messages, entries)


def take_running(document: object) -> Entries:
    """Remove the queues' `running` lists from a scenario document (so that
    the scenario itself loads as usual) and return them."""
    found: Entries = {}
    if not isinstance(document, Mapping) or not isinstance(document.get("queues"), list):
        return found
    for index, entry in enumerate(document["queues"]):
        if isinstance(entry, dict) and RUNNING in entry:
            field = f"queues[{index}].{RUNNING}"
            found[str(entry.get("name"))] = (field, list_field(entry.pop(RUNNING), field))
    return found


def read_from(file: str) -> Entries:
    """`--from FILE`: {QUEUE: [entries]}."""
    document = read_document(file)
    if not isinstance(document, Mapping):
        raise ScenarioError(f"{file}: expected a mapping of queue names to running units")
    return {str(name): (f"{file}: {name}", list_field(entries, f"{file}: {name}"))
            for name, entries in document.items()}


def running_units(scenario: Scenario, running: Entries) -> list[Unit]:
    """The running units, parsed and checked as `units` entries are."""
    known = {spec.name: spec for spec in scenario.queues}
    out: list[Unit] = []
    for name, (field, entries) in running.items():
        if name not in known:
            raise ScenarioError(f"{field}: no queue named {name!r} in the scenario")
        spec = known[name]
        document = {"capacity": {}, "queues": [{"name": name, "units": entries}]}
        try:
            parsed = load_scenario(document)
        except ScenarioError as exc:
            raise ScenarioError(re.sub(r"^queues\[0\]\.units", field, str(exc))) from None
        for unit in parsed.units:
            out.append(Unit(f"{spec.name}/{RUNNING}/{unit.key.split('/', 1)[1]}", spec.name,
                            unit.demand, unit.priority))
    # Submitted before everything waiting, in the order listed.
    return [dataclasses.replace(unit, created=float(index - len(out)))
            for index, unit in enumerate(out)]


def settle(scenario: Scenario, running: Entries) -> dict[str, Any]:
    """Start from the running units, let the scenario's units arrive, reclaim
    to the fixpoint: the JSON-ready result."""
    if has_hierarchy(scenario.queues):
        raise ScenarioError("queues[].parent: reclaim over a tree of queues is not "
                            "modelled offline yet; drop --from/running or the parents")
    simulation, started = fixpoint(scenario, running)
    whole = dataclasses.replace(scenario, units=(*started, *scenario.units))
    result = evaluate(whole, engine=simulation.engine)
    result["reclaim"] = {
        "moves": [{"round": m.round, "taker": m.taker, "for": m.for_unit, "victim": m.victim,
                   "unit": m.unit, "rule": "guarantee" if m.guarantee else "share"}
                  for m in simulation.moves],
        "rounds": simulation.rounds,
        "converged": simulation.converged,
    }
    return result


def fixpoint(scenario: Scenario, running: Entries) -> tuple[Simulation, list[Unit]]:
    """The simulation `settle` reports on, settled, and the running units it
    started from (a tree too: the simulation plays H-DRF and the tree's move
    rule; only the report, `evaluate`, is flat)."""
    started = running_units(scenario, running)
    simulation = Simulation(scenario.capacity, scenario.queues, nodes=scenario.nodes,
                            pools=scenario.pools)
    for unit in started:
        if not simulation.run(unit):
            raise ScenarioError(f"{RUNNING}: {unit.key} fits on no node of queue "
                                f"{unit.queue}'s pools next to the units listed before it")
    over = sorted(r for r, v in simulation.engine.free().items() if v < 0)
    if over:
        raise ScenarioError(f"{RUNNING}: the running units need more than the capacity "
                            f"of {', '.join(over)}")
    for unit in scenario.units:
        simulation.submit(unit)
    simulation.settle()
    return simulation, started
