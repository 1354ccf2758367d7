"""filter: may this pod be placed now, and on which of the candidate nodes?

- A pod arbiter does not manage (in an unmanaged namespace: the webhook's
  rule, `ExtenderState.is_managed`) passes untouched: every candidate node
  is returned. A pod in a managed namespace without a queue label got past
  the webhook; its queue resolves as the webhook would resolve it, and it
  is checked like any other (it has no unit, so it fails with a reason).
- A managed pod whose unit has not been admitted, or whose placement would
  push its queue over `capability` (counting bound pods and pods approved
  but not yet bound), fails every node as *unresolvable*: preemption could
  not fix either, so kube-scheduler should not try it. The reason is
  written for a person; it shows in the pod's FailedScheduling event.
- A unit admitted with a plan (QueueUnit status.admission, DESIGN §10)
  confines its pods to the nodes of its pool, any of them (the plan's own
  nodes are preferred by prioritize; a binding elsewhere in the pool is
  followed by the loop, not refused here). A unit admitted without a plan
  (before node fit, or without nodes) is not confined.
- A queue with `spec.nodeSelector` confines its pods to matching nodes; the
  other nodes fail as unresolvable too (like kube-scheduler's own
  NodeAffinity: evicting pods from a node cannot change its labels or pool).
- A node arbiter's cache does not know yet (a new node, a lagging watch)
  fails as resolvable when its labels matter, and passes when they do not.

An approval is recorded as an assumed pod of its queue (see assumed.py).

Cost: the nodes a selector allows are a set the state keeps current
(nodesets.py), so confining 5,000 candidates is a few passes in C
(`filter(allowed.__contains__, names)`), never label matching per node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from itertools import filterfalse
from typing import Literal

from arbiter.cache.ownership import pod_holding_unit
from arbiter.cache.records import PodRecord, QueueRecord, UnitRecord
from arbiter.cache.store import no_queue_message
from arbiter.core.api import QUEUE_LABEL
from arbiter.core.quantities import format_quantity
from extender.state import ExtenderState
from extender.wire import ExtenderArgs, ExtenderFilterResult

FilterVerdict = Literal["unmanaged", "passed", "rejected"]


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    result: ExtenderFilterResult
    verdict: FilterVerdict


def assume_key(pod: PodRecord) -> str:
    """Assumed pods are keyed by UID (what the cache's notifications carry)."""
    return pod.uid or f"{pod.namespace}/{pod.name}"


def admission_problem(
    state: ExtenderState, pod: PodRecord, queue_name: str | None, queue: QueueRecord | None
) -> str | None:
    """Why a managed pod may not be placed anywhere now; None when it may."""
    if queue_name is None:
        return no_queue_message(pod.namespace, "pod")
    if queue is None:
        source = "the pod's arbiter.dev/queue label" if pod.queue else "its namespace"
        return (
            f'queue "{queue_name}" (from {source}) does not exist; '
            "create the Queue or fix the label"
        )
    problems: list[str] = []
    key, named = pod_holding_unit(state.store, pod)
    unit = state.unit_of(pod)
    token = state.admitted_at_creation(pod) if unit is None else None
    if token is not None and token.queue == queue.name:
        pass  # admitted at creation; its unit is being written
    elif unit is None and named is not None:
        problems.append(
            f'queue "{queue.name}" has not admitted this pod: QueueUnit {key} stands for '
            "another consumer of that name (by uid), not this pod's; delete and recreate it "
            "to queue it"
        )
    elif unit is None:
        unlabelled = (
            f"the pod has no {QUEUE_LABEL} label, so it was created past arbiter's webhook; "
            if pod.queue is None else "was it created while arbiter was down? "
        )
        problems.append(
            f'queue "{queue.name}" has not admitted this pod: there is no QueueUnit {key} '
            f"({unlabelled}delete and recreate it to queue it)"
        )
    elif not unit.admitted and not state.released_job(pod, unit):
        problems.append(
            f'queue "{queue.name}" has not admitted this pod\'s unit {key} yet '
            f"(unit phase {unit.phase}; was the pod created while arbiter was down?)"
        )
    excess = capability_excess(state, pod, queue)
    if excess is not None:
        problems.append(excess)
    return "; ".join(problems) or None


def capability_excess(state: ExtenderState, pod: PodRecord, queue: QueueRecord) -> str | None:
    """The resources on which placing `pod` would take `queue` past its capability."""
    capability = queue.capability
    if not capability or not pod.requests:
        return None
    in_use = state.queue_in_use(queue.name, excluding=assume_key(pod))
    over: list[str] = []
    for resource, requested in sorted(pod.requests.items()):
        if resource not in capability or requested <= 0:
            continue
        used = in_use.get_amount(resource)
        if used + requested > capability[resource]:
            over.append(
                f"{resource} {format_quantity(resource, used)} in use + "
                f"{format_quantity(resource, requested)} requested > "
                f"{format_quantity(resource, capability[resource])}"
            )
    if not over:
        return None
    return f'queue "{queue.name}" would exceed its capability: {", ".join(over)}'


def _selector_text(selector: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{key}={value}" for key, value in selector)


@dataclass(frozen=True, slots=True)
class Confinement:
    """The nodes a pod may use, and why the others may not."""

    allowed: Set[str]
    # Why a node outside `allowed` fails; unresolvable, because evicting
    # pods cannot change a node's labels or pool.
    reason: str
    # `allowed` comes from arbiter's cache: a node the cache does not know
    # yet fails as resolvable (a later cycle may know it) instead.
    cached: bool = True


def confine(
    names: list[str], confinements: Iterable[Confinement], known: Mapping[str, object]
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(passed names in the given order, failed, unresolvable) after every confinement."""
    passed = names
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    for confinement in confinements:
        inside = confinement.allowed.__contains__
        outside = list(filterfalse(inside, passed))
        if not outside:
            continue
        passed = list(filter(inside, passed))
        unresolvable.update(dict.fromkeys(outside, confinement.reason))
        if confinement.cached:
            for name in filterfalse(known.__contains__, outside):
                unresolvable.pop(name, None)
                failed[name] = f"node {name} is not in arbiter's cache yet"
    return passed, failed, unresolvable


def _selector_confinement(
    state: ExtenderState, args: ExtenderArgs, queue: QueueRecord
) -> Confinement:
    selector = queue.node_selector
    reason = f'node does not match queue "{queue.name}"\'s nodeSelector {_selector_text(selector)}'
    sent_labels = args.node_labels
    if sent_labels is None:
        return Confinement(state.node_sets.matching(selector), reason)
    # Full Node objects came with the request: their labels are the freshest.
    allowed = {
        name for name, labels in zip(args.names, sent_labels, strict=True)
        if all(labels.get(key) == value for key, value in selector)
    }
    return Confinement(allowed, reason, cached=False)


def _pool_confinement(state: ExtenderState, unit: UnitRecord, pool: str) -> Confinement:
    reason = (f'node is not in pool "{pool}", where queue "{unit.queue}" admitted '
              f"unit {unit.key}")
    return Confinement(state.store.nodes_in_pool(pool), reason)


def _answer(
    args: ExtenderArgs,
    passed: list[str] | None,
    failed: dict[str, str],
    unresolvable: dict[str, str],
) -> ExtenderFilterResult:
    """The reply in the form the request came in; `passed` None means every node."""
    if args.nodes is None:
        return {
            "Nodes": None,
            "NodeNames": args.names if passed is None else passed,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }
    if passed is None:
        items = args.nodes
    else:
        keep = set(passed)
        items = [item for item, name in zip(args.nodes, args.names, strict=True) if name in keep]
    return {
        "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": items},
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }


def filter_nodes(state: ExtenderState, args: ExtenderArgs) -> FilterOutcome:
    pod = args.pod
    if not state.is_managed(pod):
        return FilterOutcome(_answer(args, None, {}, {}), "unmanaged")
    queue_name = state.queue_of(pod)
    queue = state.store.queues.get(queue_name) if queue_name is not None else None
    problem = admission_problem(state, pod, queue_name, queue)
    if problem is not None or queue is None:
        reason = problem or "queue missing"
        return FilterOutcome(_answer(args, [], {}, dict.fromkeys(args.names, reason)), "rejected")

    passed: list[str] | None = None
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    confinements: list[Confinement] = []
    unit = state.unit_of(pod)
    if unit is not None and unit.admission is not None:
        confinements.append(_pool_confinement(state, unit, unit.admission.pool))
    if queue.node_selector:
        confinements.append(_selector_confinement(state, args, queue))
    if confinements:
        passed, failed, unresolvable = confine(args.names, confinements, state.store.nodes)
    if (passed is None and args.names) or passed:
        state.assumed.assume(assume_key(pod), queue.name, pod.requests)
        verdict: FilterVerdict = "passed"
    else:
        verdict = "rejected"
    return FilterOutcome(_answer(args, passed, failed, unresolvable), verdict)
