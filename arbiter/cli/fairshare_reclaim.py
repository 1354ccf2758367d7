"""`arbiter fairshare` from a running allocation: what reclaim would do.

A queue of the scenario may list `running:` units (entries as in `units`:
`count`, `requests`, `priority`, `name`; with top-level `nodes`, an entry
of one unit may say where its pods run, `nodes: [NODE, ...]`, one per pod
in pod set order, as read from a cluster; the others are placed first fit
in the order listed), or `--from FILE` gives them apart
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
from arbiter.core.engine import Engine
from arbiter.core.engine.tree import has_hierarchy
from arbiter.core.model import MAIN_POD_SET, Placement, PodSet, Unit
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
    return [unit for unit, _ in _running(scenario, running)]


def _running(scenario: Scenario,
             running: Entries) -> list[tuple[Unit, tuple[str, ...] | None]]:
    """The running units, each with the nodes its entry names (or None)."""
    known = {spec.name: spec for spec in scenario.queues}
    out: list[Unit] = []
    where: list[tuple[str, ...] | None] = []
    for name, (field, raw_entries) in running.items():
        if name not in known:
            raise ScenarioError(f"{field}: no queue named {name!r} in the scenario")
        spec = known[name]
        entries = []
        for index, raw in enumerate(raw_entries):
            nodes = _nodes_of(raw, f"{field}[{index}]", scenario)
            entries.append({k: v for k, v in raw.items() if k != "nodes"}
                           if nodes is not None else raw)
            if nodes is not None or not isinstance(raw, Mapping):
                where.append(nodes)
            else:  # one per unit of the entry
                where.extend([None] * _count(raw))
        document = {"capacity": {}, "queues": [{"name": name, "units": entries}]}
        try:
            parsed = load_scenario(document)
        except ScenarioError as exc:
            raise ScenarioError(re.sub(r"^queues\[0\]\.units", field, str(exc))) from None
        for unit in parsed.units:
            out.append(Unit(f"{spec.name}/{RUNNING}/{unit.key.split('/', 1)[1]}", spec.name,
                            unit.demand, unit.priority))
    # Submitted before everything waiting, in the order listed.
    return [(dataclasses.replace(unit, created=float(index - len(out))), nodes)
            for index, (unit, nodes) in enumerate(zip(out, where, strict=True))]


def _count(entry: Mapping[str, Any]) -> int:
    count = entry.get("count", 1)
    return count if isinstance(count, int) and count >= 0 else 1  # else the parser says why


def _nodes_of(entry: object, field: str, scenario: Scenario) -> tuple[str, ...] | None:
    """A running entry's `nodes` (checked against the scenario's nodes), or None."""
    if not isinstance(entry, Mapping) or "nodes" not in entry:
        return None
    nodes = entry["nodes"]
    if scenario.nodes is None:
        raise ScenarioError(f"{field}.nodes: needs top-level nodes")
    if entry.get("count", 1) != 1:
        raise ScenarioError(f"{field}.nodes: only for an entry of one unit (count 1)")
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        raise ScenarioError(f"{field}.nodes: expected a list of node names")
    names = {node.name for node in scenario.nodes}
    for node in nodes:
        if node not in names:
            raise ScenarioError(f"{field}.nodes: no node named {node!r} in the scenario")
    return tuple(nodes)


def _placement(engine: Engine, unit: Unit, nodes: tuple[str, ...],
               field: str) -> Placement:
    """Where a running unit's pods run, as a plan: its nodes per pod set, in order."""
    sets = unit.pods or (PodSet(MAIN_POD_SET, 1, unit.demand),)
    if len(nodes) != sum(ps.count for ps in sets):
        raise ScenarioError(f"{field}: {unit.key} has {sum(ps.count for ps in sets)} pod(s), "
                            f"{len(nodes)} node(s) given")
    pools = {engine.pool_of(node) for node in nodes}
    if len(pools) != 1 or None in pools:
        raise ScenarioError(f"{field}: {unit.key}'s nodes are not in one pool")
    placed: dict[str, tuple[str, ...]] = {}
    at = 0
    for ps in sets:
        placed[ps.name] = nodes[at: at + ps.count]
        at += ps.count
    return Placement(str(pools.pop()), placed)


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
    placed = _running(scenario, running)
    started = [unit for unit, _ in placed]
    simulation = Simulation(scenario.capacity, scenario.queues, nodes=scenario.nodes,
                            pools=scenario.pools)
    for unit, nodes in placed:
        where = None if nodes is None else _placement(simulation.engine, unit, nodes,
                                                       f"{RUNNING}.nodes")
        if not simulation.run(unit, where):
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
