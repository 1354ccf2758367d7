"""The `arbiter fairshare` scenario: reading it (fields, bounds, one-line
errors naming the field) and evaluating it with the engine. The format is
described in `arbiter.cli.fairshare`."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from arbiter.core.deserved import deserved, hierarchical_deserved
from arbiter.core.engine import Engine, new_engine
from arbiter.core.engine.flat import format_share
from arbiter.core.engine.tree import HierarchicalEngine
from arbiter.core.model import (
    CHILD_ORDERS,
    DEFAULT_POOL,
    MAIN_POD_SET,
    QUEUE_POLICIES,
    Node,
    PodSet,
    Pool,
    QueuePolicy,
    QueueSpec,
    Unit,
)
from arbiter.core.partial import admit_partial, can_shrink
from arbiter.core.quantities import QuantityError, format_quantity
from arbiter.core.resources import EMPTY, Resources

MAX_UNITS = 1_000_000  # expanded units per scenario (a typo in a count should not eat the RAM)

MAX_NODES = 100_000  # expanded nodes per scenario

_TOP_FIELDS = ("capacity", "queues", "nodes", "pools")
_QUEUE_FIELDS = (
    "name", "weight", "guarantee", "capability", "blocking", "queuePolicy", "units",
    "pools", "nodeSelector", "parent", "childOrder",
)
_UNIT_FIELDS = ("count", "requests", "priority", "name", "pods", "minCount")
_NODE_FIELDS = ("name", "labels", "allocatable", "used", "count")
_POOL_FIELDS = ("name", "nodeSelector")


class ScenarioError(ValueError):
    """Invalid scenario; the message is one line and starts with the field."""


@dataclass(frozen=True)
class Scenario:
    capacity: Resources
    resources: tuple[str, ...]  # capacity's resource names as written (zeros included)
    queues: tuple[QueueSpec, ...]
    units: tuple[Unit, ...]
    nodes: tuple[Node, ...] | None = None  # None: aggregate capacity only
    pools: tuple[Pool, ...] = ()


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


def _labels(value: object, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{field}: expected a mapping of label to value, got {_kind(value)}")
    for key, label in value.items():
        if not isinstance(key, str) or not key or not isinstance(label, str):
            raise ScenarioError(
                f"{field}.{key}: labels are non-empty strings with string values"
            )
    return dict(value)


def list_field(value: object, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ScenarioError(f"{field}: expected a list, got {_kind(value)}")
    return value


def _named(raw: object, field: str, allowed: tuple[str, ...]) -> tuple[Mapping[str, Any], str]:
    """A list entry with a required `name`: the entry and its name."""
    entry = _mapping(raw, field, allowed)
    if "name" not in entry:
        raise ScenarioError(f"{field}.name: required")
    return entry, _name(entry["name"], f"{field}.name")


def _load_nodes(raw_nodes: object) -> tuple[Node, ...]:
    nodes: list[Node] = []
    seen: set[str] = set()
    for ni, raw_node in enumerate(list_field(raw_nodes, "nodes")):
        nf = f"nodes[{ni}]"
        entry, name = _named(raw_node, nf, _NODE_FIELDS)
        if "allocatable" not in entry or not isinstance(entry["allocatable"], Mapping):
            raise ScenarioError(f"{nf}.allocatable: required, a mapping of resource to quantity")
        allocatable = _resources(entry["allocatable"], f"{nf}.allocatable")
        used = _resources(entry.get("used"), f"{nf}.used")
        labels = _labels(entry.get("labels"), f"{nf}.labels")
        count = _integer(entry.get("count", 1), f"{nf}.count", minimum=1)
        if len(nodes) + count > MAX_NODES:
            raise ScenarioError(f"{nf}.count: more than {MAX_NODES} nodes in the scenario")
        names = [name] if "count" not in entry else [f"{name}-{k}" for k in range(count)]
        for node_name in names:
            if node_name in seen:
                raise ScenarioError(f"{nf}.name: duplicate node name {node_name!r}")
            seen.add(node_name)
            nodes.append(Node(node_name, labels, allocatable, used))
    return tuple(nodes)


# Each pool: a unique name (not "default") and the nodeSelector that picks its nodes.
def _load_pools(raw_pools: object) -> tuple[Pool, ...]:
    pools: list[Pool] = []
    seen: set[str] = set()
    for pi, raw_pool in enumerate(list_field(raw_pools, "pools")):
        pf = f"pools[{pi}]"
        entry, name = _named(raw_pool, pf, _POOL_FIELDS)
        if name == DEFAULT_POOL:
            raise ScenarioError(
                f"{pf}.name: {DEFAULT_POOL!r} is the pool of the nodes no pool selects"
            )
        if name in seen:
            raise ScenarioError(f"{pf}.name: duplicate pool name {name!r}")
        seen.add(name)
        pools.append(Pool(name, _labels(entry.get("nodeSelector"), f"{pf}.nodeSelector")))
    return tuple(pools)


def _queue_pools(entry: Mapping[str, Any], qf: str, known: set[str] | None) -> tuple[str, ...]:
    if "pools" not in entry:
        return ()
    if known is None:
        raise ScenarioError(f"{qf}.pools: needs top-level nodes")
    raw = list_field(entry["pools"], f"{qf}.pools")
    names = tuple(_name(pool, f"{qf}.pools[{i}]") for i, pool in enumerate(raw))
    for i, pool in enumerate(names):
        if pool not in known:
            raise ScenarioError(f"{qf}.pools[{i}]: unknown pool {pool!r}")
    return names


def load_scenario(document: object) -> Scenario:
    """Validate a parsed scenario document; ScenarioError names the bad field."""
    if document is None:
        raise ScenarioError("capacity: required (the scenario is empty)")
    top = _mapping(document, "", _TOP_FIELDS)
    nodes: tuple[Node, ...] | None = None
    pools: tuple[Pool, ...] = ()
    known_pools: set[str] | None = None
    if "nodes" in top:
        if "capacity" in top:
            raise ScenarioError("capacity: not allowed with nodes (the capacity is their sum)")
        nodes = _load_nodes(top["nodes"])
        pools = _load_pools(top.get("pools"))
        known_pools = {pool.name for pool in pools} | {DEFAULT_POOL}
        capacity = EMPTY
        names: dict[str, None] = {}
        for node in nodes:
            capacity = capacity + (node.allocatable - node.used)
            names.update(dict.fromkeys(node.allocatable))
        resources = tuple(names)
    else:
        if "pools" in top:
            raise ScenarioError("pools: needs nodes")
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
        if "nodeSelector" in entry and nodes is None:
            raise ScenarioError(f"{qf}.nodeSelector: needs top-level nodes")
        parent = None if entry.get("parent") is None else _name(entry["parent"], f"{qf}.parent")
        if parent is not None and nodes is not None:
            raise ScenarioError(f"{qf}.parent: hierarchical queues are evaluated on aggregate "
                                "capacity; give capacity instead of nodes")
        child_order = entry.get("childOrder", "Fair")
        if child_order not in CHILD_ORDERS:
            raise ScenarioError(f"{qf}.childOrder: must be Fair or Queue, got {child_order!r}")
        queues.append(
            QueueSpec(
                name=name,
                weight=weight,
                guarantee=_resources(entry.get("guarantee"), f"{qf}.guarantee"),
                capability=_resources(entry.get("capability"), f"{qf}.capability", keep_zero=True),
                blocking=blocking,
                policy=queue_policy,
                pools=_queue_pools(entry, qf, known_pools),
                node_selector=_labels(entry.get("nodeSelector"), f"{qf}.nodeSelector"),
                parent=parent,
                child_order="Queue" if child_order == "Queue" else "Fair",
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
            pods: tuple[PodSet, ...] = ()
            if "pods" in unit:
                per_unit = _integer(unit["pods"], f"{uf}.pods", minimum=1)
                minimum = None
                if "minCount" in unit:  # partial admission (DESIGN §12)
                    minimum = _integer(unit["minCount"], f"{uf}.minCount", minimum=1)
                    if minimum > per_unit:
                        raise ScenarioError(f"{uf}.minCount: {minimum} is more than pods "
                                            f"({per_unit})")
                pods = (PodSet(MAIN_POD_SET, per_unit, requests, minimum),)
                requests = requests.scale(per_unit)
            elif "minCount" in unit:
                raise ScenarioError(f"{uf}.minCount: needs pods (how many the unit asks for)")
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
                        pods=pods,
                    )
                )
    _check_tree(queues, units)
    return Scenario(capacity, resources, tuple(queues), tuple(units), nodes, pools)


def _check_tree(queues: list[QueueSpec], units: list[Unit]) -> None:
    """Parents exist, no cycle, and a parent has no units (DESIGN §11)."""
    specs = {spec.name: (i, spec) for i, spec in enumerate(queues)}
    for i, spec in enumerate(queues):
        seen = {spec.name}
        current = spec.parent
        while current is not None:
            if current not in specs:
                raise ScenarioError(f"queues[{i}].parent: queue {current!r} does not exist")
            if current in seen:
                raise ScenarioError(f"queues[{i}].parent: cycle through {current!r}")
            seen.add(current)
            current = specs[current][1].parent
    children: dict[str, list[str]] = {}
    for spec in queues:
        if spec.parent is not None:
            children.setdefault(spec.parent, []).append(spec.name)
    for unit in units:
        below = children.get(unit.queue)
        if below:
            raise ScenarioError(
                f"queues[{specs[unit.queue][0]}].units: queue {unit.queue!r} is a parent and "
                f"holds no work of its own; give its units to its children ({', '.join(below)})")


# -- evaluation -------------------------------------------------------------


def _quantities(amounts: Resources, names: tuple[str, ...]) -> dict[str, str]:
    keys = sorted(set(names) | set(amounts))
    return {r: format_quantity(r, amounts.get_amount(r)) for r in keys}



def _pools_of(engine: Engine, queue: str) -> dict[str, int]:
    """Admitted units of `queue` per pool (sorted by pool name)."""
    counts: dict[str, int] = {}
    for unit in engine.admitted(queue):
        placement = engine.plan(unit.key)
        if placement is not None:
            counts[placement.pool] = counts.get(placement.pool, 0) + 1
    return dict(sorted(counts.items()))


def _pod_count(unit: Unit) -> int:
    return sum(ps.count for ps in unit.pods)


def _demand(scenario: Scenario) -> dict[str, Resources]:
    """Each queue's total demand (all its units), for deserved."""
    demand: dict[str, Resources] = {}
    for unit in scenario.units:
        demand[unit.queue] = demand.get(unit.queue, EMPTY) + unit.demand
    return demand


def _entry(engine: Engine, name: str,
           fair: Mapping[str, Resources], names: tuple[str, ...]) -> dict[str, Any]:
    return {
        "admitted": engine.admitted_count(name),
        "allocated": _quantities(engine.allocated(name), names),
        "dominantShare": format_share(engine.dominant_share(name)),
        "deserved": _quantities(fair[name], names),
    }


def evaluate(scenario: Scenario, *, order: bool = False,
             engine: Engine | None = None) -> dict[str, Any]:
    """Run the engine over the scenario; the JSON-ready result (with `engine`:
    its allocation as it stands, e.g. reclaim's fixpoint)."""
    if engine is None:
        engine = new_engine(scenario.capacity, scenario.queues, scenario.nodes, scenario.pools)
        for unit in scenario.units:
            engine.add_pending(unit)
        if isinstance(engine, HierarchicalEngine):
            return _evaluate_tree(scenario, engine, order=order)
    admitted = engine.admit_all()
    shrinkable = sorted((u for u in scenario.units if can_shrink(u)),
                        key=lambda u: (-u.priority, u.created, u.key))
    if shrinkable:
        admitted += admit_partial(engine, shrinkable)
    fair = deserved(scenario.capacity, scenario.queues, _demand(scenario))
    names = scenario.resources
    out: dict[str, Any] = {
        "queues": {spec.name: _entry(engine, spec.name, fair, names)
                   for spec in scenario.queues},
        "free": _quantities(engine.free(), names),
    }
    asked = {u.key: _pod_count(u) for u in shrinkable}
    for spec in scenario.queues if asked else ():
        # Units admitted with fewer pods than asked: key -> pods admitted.
        partial = {u.key: _pod_count(u) for u in engine.admitted(spec.name)
                   if _pod_count(u) < asked.get(u.key, 0)}
        if partial:
            out["queues"][spec.name]["partial"] = partial
    if scenario.nodes is not None:
        for spec in scenario.queues:
            entry = out["queues"][spec.name]
            entry["pools"] = _pools_of(engine, spec.name)
            waiting = engine.explain(spec.name)
            if waiting:
                entry["waiting"] = waiting
    if order:
        out["order"] = [unit.key for unit in admitted]
    return out


def _evaluate_tree(scenario: Scenario, engine: HierarchicalEngine, *,
                   order: bool) -> dict[str, Any]:
    """`evaluate` for a tree of queues (DESIGN §11), its units pending in
    `engine`: per queue as flat, plus `parent` on a child and `subtree`
    totals on a parent."""
    admitted = engine.admit_all()
    fair = hierarchical_deserved(scenario.capacity, scenario.queues, _demand(scenario))
    names = scenario.resources
    queues: dict[str, Any] = {}
    for spec in scenario.queues:
        entry = _entry(engine, spec.name, fair, names)
        if spec.parent is not None:
            entry["parent"] = spec.parent
        if engine.children(spec.name):
            entry["deserved"] = _quantities(EMPTY, names)
            entry["subtree"] = {
                "allocated": _quantities(engine.subtree_allocated(spec.name), names),
                "dominantShare": format_share(engine.subtree_share(spec.name)),
                "deserved": _quantities(fair[spec.name], names),
            }
        queues[spec.name] = entry
    out: dict[str, Any] = {"queues": queues, "free": _quantities(engine.free(), names)}
    if order:
        out["order"] = [unit.key for unit in admitted]
    return out
