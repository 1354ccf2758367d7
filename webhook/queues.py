"""Queues (cluster-scoped): validating only.

Weight an integer > 0, every quantity valid, guarantee ≤ capability where
both are set, a namespace listed by at most one Queue, a valid
`spec.namespaceSelector` (the namespaces it matches may use the queue, as
may those listed; DESIGN §3), a parent that exists
and holds no unfinished work of its own, no cycle through parents; a Queue
with admitted work, or that is the parent of another Queue, cannot be
deleted. Every error names its field.
"""

from __future__ import annotations

import re
from typing import Any

from arbiter.core.api import ADMITTED_PHASES, API_GROUP, FINISHED_PHASES, QUEUE
from arbiter.core.jsonvalues import brief
from arbiter.core.quantities import QuantityError, format_quantity
from arbiter.core.resources import EMPTY, Resources, resource_name_problem
from arbiter.core.selectors import SelectorError, parse_selector
from webhook.queueing import not_ready
from webhook.review import (
    ALLOW,
    AdmissionEnv,
    AdmissionRequest,
    Decision,
    Obj,
    allow,
    deny,
    is_int,
    require_object,
    text_field,
)

GROUP, KIND = API_GROUP, QUEUE.kind

# A queue name is used as the value of the arbiter.dev/queue label.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_ENUMS: dict[str, tuple[str, ...]] = {
    "queuePolicy": ("Priority", "FIFO"),
    "state": ("Open", "Closed"),
    "childOrder": ("Fair", "Queue"),
}


def _resources(spec: Obj, key: str, errors: list[str]) -> Resources:
    try:
        parsed = Resources.parse(spec.get(key), field=f"spec.{key}")
    except QuantityError as error:
        errors.append(str(error))
        return EMPTY
    for name in parsed:
        problem = resource_name_problem(name)
        if problem is not None:
            errors.append(f"spec.{key}: resource name {brief(name, 80)} {problem}")
    return parsed


def check_spec(name: str, spec: Any, env: AdmissionEnv) -> tuple[list[str], list[str]]:
    """(errors, warnings) for a Queue named `name` with `spec`."""
    errors: list[str] = []
    warnings: list[str] = []
    if not _LABEL_VALUE.match(name):
        errors.append(
            f'metadata.name: "{name:.80}" must be a valid label value (at most 63 letters, '
            "digits, '-', '_' or '.'), since work names its queue in the arbiter.dev/queue label"
        )
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        return [*errors, "spec: must be an object"], warnings
    weight = spec.get("weight", 1)
    if not is_int(weight) or weight <= 0:
        errors.append(f"spec.weight: {brief(weight)} must be an integer > 0")
    guarantee = _resources(spec, "guarantee", errors)
    capability = _resources(spec, "capability", errors)
    # Zero amounts are dropped from Resources, yet "cpu: 0" is a real cap.
    raw_caps = spec.get("capability")
    capped = set(raw_caps) if isinstance(raw_caps, dict) else set()
    for resource, amount in guarantee.items():
        cap = capability.get_amount(resource)
        if resource in capped and amount > cap:
            errors.append(
                f"spec.guarantee.{resource} ({format_quantity(resource, amount)}) exceeds "
                f"spec.capability.{resource} ({format_quantity(resource, cap)})"
            )
    for key, allowed in _ENUMS.items():
        value = spec.get(key)
        if value is not None and value not in allowed:
            errors.append(f"spec.{key}: {brief(value)} must be one of {', '.join(allowed)}")
    for key in ("blocking", "reclaimable"):
        value = spec.get(key)
        if value is not None and not isinstance(value, bool):
            errors.append(f"spec.{key}: must be a boolean")
    priority = spec.get("priority")
    if priority is not None and not is_int(priority):
        errors.append("spec.priority: must be an integer")
    selector = spec.get("nodeSelector")
    if selector is not None and (
        not isinstance(selector, dict)
        or not all(isinstance(v, str) for v in selector.values())
    ):
        errors.append("spec.nodeSelector: must be a map of label name to string value")
    preemption = spec.get("preemption")
    if preemption is not None:
        within = preemption.get("withinQueue") if isinstance(preemption, dict) else None
        if not isinstance(preemption, dict) or (
            within is not None and within not in ("Never", "LowerPriority")
        ):
            errors.append("spec.preemption.withinQueue: must be Never or LowerPriority")
    _check_namespaces(name, spec.get("namespaces"), env, errors, warnings)
    try:
        parse_selector(spec.get("namespaceSelector"), "spec.namespaceSelector")
    except SelectorError as error:
        errors.append(str(error))
    _check_parent(name, spec.get("parent"), env, errors)
    if not errors and guarantee:
        _warn_guarantees(name, guarantee, env, warnings)
    if not errors and not spec.get("namespaces") and spec.get("namespaceSelector") is None:
        warnings.append("spec.namespaces and spec.namespaceSelector are both empty: every "
                        "managed namespace may use this queue (list or select namespaces to "
                        "keep it to a team)")
    return errors, warnings


def _check_namespaces(name: str, namespaces: Any, env: AdmissionEnv,
                      errors: list[str], warnings: list[str]) -> None:
    if namespaces is None:
        return
    if not isinstance(namespaces, list) or not all(
        isinstance(n, str) and n for n in namespaces
    ):
        errors.append("spec.namespaces: must be a list of namespace names")
        return
    if len(set(namespaces)) != len(namespaces):
        warnings.append("spec.namespaces lists a namespace more than once")
    mine = set(namespaces)
    for other in env.store.queues.values():
        if other.name == name:
            continue
        for namespace in other.namespaces:
            if namespace in mine:
                errors.append(
                    f'spec.namespaces: namespace "{namespace}" is already listed by Queue '
                    f'"{other.name}"; a namespace defaults to one queue only'
                )
                mine.discard(namespace)


def _check_parent(name: str, parent: Any, env: AdmissionEnv, errors: list[str]) -> None:
    if parent is None or parent == "":
        return
    if not isinstance(parent, str):
        errors.append("spec.parent: must be a queue name")
        return
    if parent == name:
        errors.append(f'spec.parent: queue "{name}" cannot be its own parent')
        return
    queues = env.store.queues
    if parent not in queues:
        errors.append(f'spec.parent: queue "{parent}" does not exist')
        return
    if not env.store.queue_children.get(parent):
        # It becomes a parent now: a parent holds no work of its own (§11).
        held = sorted(unit.key for unit in env.store.units.values()
                      if unit.queue == parent and unit.phase not in FINISHED_PHASES)
        if held:
            errors.append(
                f'spec.parent: queue "{parent}" still holds {len(held)} unit(s) of its own '
                f"({', '.join(held[:3])}) and a parent holds no work: let them finish or "
                "move them first"
            )
            return
    chain = [name, parent]
    on_chain = {name, parent}  # a set: the walk is linear in the chain's length
    current = queues[parent].parent
    while current:
        if current == name:
            chain.append(current)
            errors.append(f"spec.parent: would create a cycle: {_chain_text(chain)}")
            return
        if current in on_chain or current not in queues:
            return  # an existing cycle or dangling parent not involving this queue
        chain.append(current)
        on_chain.add(current)
        current = queues[current].parent


def _chain_text(chain: list[str], shown: int = 8) -> str:
    if len(chain) <= shown + 1:
        return " → ".join(chain)
    return f"{' → '.join(chain[:shown])} → … → {chain[-1]} ({len(chain) - 1} queues)"


def _warn_guarantees(name: str, guarantee: Resources, env: AdmissionEnv,
                     warnings: list[str]) -> None:
    store = env.store
    if "Node" not in store.synced_kinds or not store.nodes:
        return
    capacity = store.capacity()
    total = guarantee
    for queue in store.queues.values():
        if queue.name != name:
            total = total + queue.guarantee
    for resource in sorted(guarantee):
        if total.get_amount(resource) > capacity.get_amount(resource):
            warnings.append(
                f"the Queues' guarantees of {resource} add up to "
                f"{format_quantity(resource, total.get_amount(resource))}, more than the "
                f"cluster's {format_quantity(resource, capacity.get_amount(resource))}: "
                "not every guarantee can be honoured"
            )


def validate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    if request.operation == "DELETE":
        return _validate_delete(request, env)
    if request.operation not in ("CREATE", "UPDATE"):
        return ALLOW
    waiting = not_ready(env, ("Queue",))
    if waiting is not None:
        return waiting
    queue = require_object(request)
    meta = queue.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        name = request.name
    errors, warnings = check_spec(name, queue.get("spec"), env)
    if errors:
        return deny(f'Queue "{name:.80}" is invalid: ' + "; ".join(errors), code=422,
                    warnings=warnings)
    return allow(warnings=warnings)


def _validate_delete(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    name = request.name
    if not name and request.old_object is not None:
        meta = request.old_object.get("metadata")
        name = text_field(meta, "name")
    if not name:
        return ALLOW  # a collection delete names no object; nothing to protect here
    waiting = not_ready(env, ("Queue", "QueueUnit"))
    if waiting is not None:
        return waiting
    admitted = sorted(
        unit.key for unit in env.store.units.values()
        if unit.queue == name and unit.phase in ADMITTED_PHASES
    )
    if admitted:
        example = ", ".join(admitted[:3])
        return deny(
            f'queue "{name}" still has {len(admitted)} admitted unit(s) ({example}): '
            "close it (spec.state: Closed) and wait for them to finish before deleting it"
        )
    children = sorted(env.store.queue_children.get(name, ()))
    if children:
        return deny(
            f'queue "{name}" is the parent of {", ".join(children[:5])}: '
            "change or remove their spec.parent first"
        )
    return ALLOW
