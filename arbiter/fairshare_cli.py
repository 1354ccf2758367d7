"""`arbiter fairshare FILE`: run the fair-share engine offline on a scenario.

The scenario (YAML or JSON, DESIGN.md §4):

    capacity: {cpu: "9", memory: 18Gi}
    queues:
      - name: A
        weight: 1                      # optional, positive integer
        guarantee: {}                  # optional
        capability: {}                 # optional
        blocking: false                # optional
        queuePolicy: Priority          # optional: Priority (default) | FIFO
        units:                         # in submission order
          - {count: 10, requests: {cpu: "1", memory: 4Gi}, priority: 0}

A unit entry may also carry a `name`; `count` (default 1) expands it into that
many identical units. Units are created in file order (creation time = index).
Every unit is offered to the engine, which admits until nothing fits; the
output is JSON:

    {"queues": {"A": {"admitted": 3, "allocated": {...}, "dominantShare": 0.6667,
                      "deserved": {...}}, ...},
     "free": {...}}

Quantities are canonical Kubernetes strings and list every resource of the
capacity (zeros included); shares are rounded to 4 places; `deserved` is
computed over each queue's total demand (all its units). Bad input exits 2
with one line on stderr naming the field.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from arbiter.core.fairshare import (
    QUEUE_POLICIES,
    AdmissionEngine,
    QueuePolicy,
    QueueSpec,
    Unit,
    deserved,
    format_share,
)
from arbiter.core.quantities import QuantityError, format_quantity
from arbiter.core.resources import EMPTY, Resources

MAX_UNITS = 1_000_000  # expanded units per scenario (a typo in a count should not eat the RAM)

_TOP_FIELDS = ("capacity", "queues")
_QUEUE_FIELDS = ("name", "weight", "guarantee", "capability", "blocking", "queuePolicy", "units")
_UNIT_FIELDS = ("count", "requests", "priority", "name")


class ScenarioError(ValueError):
    """Invalid scenario; the message is one line and starts with the field."""


@dataclass(frozen=True)
class Scenario:
    capacity: Resources
    resources: tuple[str, ...]  # capacity's resource names as written (zeros included)
    queues: tuple[QueueSpec, ...]
    units: tuple[Unit, ...]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "fairshare",
        help="run the fair-share engine offline on a scenario file",
        description=(
            "Admit a scenario's units with the weighted-DRF engine and print, per "
            "queue, what it gets (admitted, allocated, dominantShare, deserved) and "
            "what stays free, as JSON."
        ),
    )
    parser.add_argument("file", metavar="FILE", help="scenario, YAML or JSON ('-' = stdin)")
    parser.add_argument(
        "--order",
        action="store_true",
        help='also list the admitted units in admission order (key "order")',
    )
    parser.add_argument(
        "--from", dest="start", metavar="RUNNING",
        help="start from these running units ({QUEUE: [units]}; or list them as a queue's "
             "`running:`) and print the reclaim moves and the fixpoint",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from arbiter import fairshare_reclaim  # builds on this module

    try:
        document = read_document(str(args.file))
        running = fairshare_reclaim.take_running(document)
        scenario = load_scenario(document)
        if args.start:
            running.update(fairshare_reclaim.read_from(str(args.start)))
        result = (fairshare_reclaim.settle(scenario, running) if running or args.start
                  else evaluate(scenario, order=bool(args.order)))
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


# -- input ------------------------------------------------------------------


def read_document(file: str) -> object:
    """Read and parse FILE (JSON when it ends in .json, else YAML, which covers JSON)."""
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{file}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{file}: not UTF-8 text") from None
    if file.endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScenarioError(
                f"{file}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{file}: invalid YAML{where}: {problem}") from None


def _mapping(value: object, field: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{field}: expected a mapping, got {_kind(value)}")
    for key in value:
        if key not in allowed:
            where = f"{field}.{key}" if field else str(key)
            raise ScenarioError(f"{where}: unknown field (expected one of: {', '.join(allowed)})")
    return value


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _resources(value: object, field: str, *, keep_zero: bool = False) -> Resources:
    if value is None:
        return EMPTY
    try:
        return Resources.parse(value, field=field, keep_zero=keep_zero)  # type: ignore[arg-type]
    except QuantityError as exc:
        raise ScenarioError(str(exc)) from None


def _integer(value: object, field: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{field}: must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ScenarioError(f"{field}: must be {what}, got {value!r}")
    return value


def _name(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{field}: must be a non-empty string, got {value!r}")
    return value


def load_scenario(document: object) -> Scenario:
    """Validate a parsed scenario document; ScenarioError names the bad field."""
    if document is None:
        raise ScenarioError("capacity: required (the scenario is empty)")
    top = _mapping(document, "", _TOP_FIELDS)
    if "capacity" not in top:
        raise ScenarioError("capacity: required")
    raw_capacity = top["capacity"]
    if not isinstance(raw_capacity, Mapping):
        raise ScenarioError(f"capacity: expected a mapping, got {_kind(raw_capacity)}")
    capacity = _resources(raw_capacity, "capacity")
    resources = tuple(str(name) for name in raw_capacity)

    raw_queues = top.get("queues")
    if raw_queues is None:
        raw_queues = []
    if not isinstance(raw_queues, list):
        raise ScenarioError(f"queues: expected a list, got {_kind(raw_queues)}")
    queues: list[QueueSpec] = []
    units: list[Unit] = []
    seen: set[str] = set()
    for qi, raw_queue in enumerate(raw_queues):
        qf = f"queues[{qi}]"
        entry = _mapping(raw_queue, qf, _QUEUE_FIELDS)
        if "name" not in entry:
            raise ScenarioError(f"{qf}.name: required")
        name = _name(entry["name"], f"{qf}.name")
        if name in seen:
            raise ScenarioError(f"{qf}.name: duplicate queue name {name!r}")
        seen.add(name)
        weight = _integer(entry.get("weight", 1), f"{qf}.weight", minimum=1)
        blocking = entry.get("blocking", False)
        if not isinstance(blocking, bool):
            raise ScenarioError(f"{qf}.blocking: must be true or false, got {blocking!r}")
        policy = entry.get("queuePolicy", "Priority")
        if policy not in QUEUE_POLICIES:
            raise ScenarioError(f"{qf}.queuePolicy: must be Priority or FIFO, got {policy!r}")
        queue_policy: QueuePolicy = "FIFO" if policy == "FIFO" else "Priority"
        queues.append(
            QueueSpec(
                name=name,
                weight=weight,
                guarantee=_resources(entry.get("guarantee"), f"{qf}.guarantee"),
                capability=_resources(entry.get("capability"), f"{qf}.capability", keep_zero=True),
                blocking=blocking,
                policy=queue_policy,
            )
        )
        raw_units = entry.get("units")
        if raw_units is None:
            raw_units = []
        if not isinstance(raw_units, list):
            raise ScenarioError(f"{qf}.units: expected a list, got {_kind(raw_units)}")
        unit_names: set[str] = set()
        for ui, raw_unit in enumerate(raw_units):
            uf = f"{qf}.units[{ui}]"
            unit = _mapping(raw_unit, uf, _UNIT_FIELDS)
            count = _integer(unit.get("count", 1), f"{uf}.count", minimum=0)
            if "requests" not in unit:
                raise ScenarioError(f"{uf}.requests: required")
            if not isinstance(unit["requests"], Mapping):
                raise ScenarioError(
                    f"{uf}.requests: expected a mapping, got {_kind(unit['requests'])}"
                )
            requests = _resources(unit["requests"], f"{uf}.requests")
            priority = _integer(unit.get("priority", 0), f"{uf}.priority")
            base = f"unit-{ui}"
            if "name" in unit:
                base = _name(unit["name"], f"{uf}.name")
                if base in unit_names:
                    raise ScenarioError(
                        f"{uf}.name: duplicate unit name {base!r} in queue {name!r}"
                    )
                unit_names.add(base)
            if len(units) + count > MAX_UNITS:
                raise ScenarioError(f"{uf}.count: more than {MAX_UNITS} units in the scenario")
            for k in range(count):
                suffix = "" if count == 1 and "name" in unit else f"-{k}"
                units.append(
                    Unit(
                        key=f"{name}/{base}{suffix}",
                        queue=name,
                        demand=requests,
                        priority=priority,
                        created=float(len(units)),
                    )
                )
    return Scenario(capacity, resources, tuple(queues), tuple(units))


# -- evaluation -------------------------------------------------------------


def _quantities(amounts: Resources, names: tuple[str, ...]) -> dict[str, str]:
    keys = sorted(set(names) | set(amounts))
    return {r: format_quantity(r, amounts.get_amount(r)) for r in keys}



def evaluate(scenario: Scenario, *, order: bool = False,
             engine: AdmissionEngine | None = None) -> dict[str, Any]:
    """Run the engine over the scenario; the JSON-ready result (with `engine`:
    its allocation as it stands, e.g. reclaim's fixpoint)."""
    if engine is None:
        engine = AdmissionEngine(scenario.capacity, scenario.queues)
        for unit in scenario.units:
            engine.add_pending(unit)
    admitted = engine.admit_all()
    demand: dict[str, Resources] = {}
    for unit in scenario.units:
        demand[unit.queue] = demand.get(unit.queue, EMPTY) + unit.demand
    fair = deserved(scenario.capacity, scenario.queues, demand)
    names = scenario.resources
    out: dict[str, Any] = {
        "queues": {
            spec.name: {
                "admitted": engine.admitted_count(spec.name),
                "allocated": _quantities(engine.allocated(spec.name), names),
                "dominantShare": format_share(engine.dominant_share(spec.name)),
                "deserved": _quantities(fair[spec.name], names),
            }
            for spec in scenario.queues
        },
        "free": _quantities(engine.free(), names),
    }
    if order:
        out["order"] = [unit.key for unit in admitted]
    return out
