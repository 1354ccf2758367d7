"""JobFlows (namespaced): validating only.

Step names unique, every target an existing step, no self-dependency, no
cycle (the message names its steps: `spec.flows: cycle a -> b -> a`), every
Job name `<flow>-<step>-r<n>` a valid name, every referenced JobTemplate
present in the namespace, the queue resolvable and open; `spec.flows`
cannot change once the flow has started (its status phase is past
`Pending`). Reads the cache only.
"""

from __future__ import annotations

from typing import Any

from arbiter.cache.jobflow_records import FlowSpec, FlowSpecError, parse_flow_spec
from arbiter.core.api import API_GROUP, JOB_FLOW
from arbiter.core.jsonvalues import json_equal
from arbiter.jobflow.dag import MAX_PROBLEMS, validate_steps
from webhook.queueing import (
    QUEUE_KINDS,
    check_open,
    no_queue_message,
    not_ready,
    queue_denial,
)
from webhook.review import (
    ALLOW,
    AdmissionEnv,
    AdmissionRequest,
    Decision,
    Obj,
    deny,
    get_labels,
    get_map,
    require_object,
    text_field,
)

GROUP, KIND = API_GROUP, JOB_FLOW.kind


def _phase(flow: Obj) -> str:
    status = flow.get("status")
    state = status.get("state") if isinstance(status, dict) else None
    phase = state.get("phase") if isinstance(state, dict) else None
    return phase if isinstance(phase, str) else ""


def _spec(flow: Obj) -> Any:
    return flow.get("spec")


def _flows(flow: Obj) -> Any:
    spec = flow.get("spec")
    return spec.get("flows") if isinstance(spec, dict) else None


def validate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    if request.operation not in ("CREATE", "UPDATE"):
        return ALLOW
    flow = require_object(request)
    meta = get_map(flow, "metadata", "request.object.metadata") or {}
    name = text_field(meta, "name", request.name)
    namespace = text_field(meta, "namespace", request.namespace)
    what = f'JobFlow "{namespace}/{name}"'
    if request.operation == "UPDATE":
        old = require_object(request, old=True)
        if json_equal(_spec(old), _spec(flow)):
            # Metadata or finalizer changes, e.g. while it is being deleted.
            return ALLOW
        phase = _phase(old)
        if not json_equal(_flows(old), _flows(flow)) and phase not in ("", "Pending"):
            return deny(f"{what} is invalid: spec.flows: cannot change once the flow has "
                        f"started (phase {phase}); create a new JobFlow instead", code=422)
    try:
        spec = parse_flow_spec(flow.get("spec"))
    except FlowSpecError as error:
        return deny(f"{what} is invalid: {error}", code=422)
    problems = [str(p) for p in validate_steps(spec.steps, name)]
    if problems:
        return deny(f"{what} is invalid: " + "; ".join(problems), code=422)
    labels = get_labels(meta, "request.object.metadata")
    return _check_references(spec, namespace, labels, what, env)


def _check_references(spec: FlowSpec, namespace: str, labels: dict[str, str] | None,
                      what: str, env: AdmissionEnv) -> Decision:
    store = env.store
    waiting = not_ready(env, ("JobTemplate",))
    if waiting is not None:
        return waiting
    missing: list[str] = []
    more = 0
    for index, step in enumerate(spec.steps):
        if f"{namespace}/{step.template}" not in store.jobtemplates:
            if len(missing) == MAX_PROBLEMS:
                more += 1
                continue
            field = "template" if step.template != step.name else "name"
            missing.append(f'spec.flows[{index}].{field}: JobTemplate "{step.template}" '
                           f'not found in namespace "{namespace}"')
    if more:
        missing.append(f"and {more} more missing JobTemplates")
    if missing:
        return deny(f"{what} is invalid: " + "; ".join(missing), code=422)
    if not store.is_managed_namespace(namespace):
        return ALLOW
    waiting = not_ready(env, QUEUE_KINDS)
    if waiting is not None:
        return waiting
    if spec.queue:
        return queue_denial(store, spec.queue, f'{what}: spec.queue: queue "{spec.queue}"',
                            namespace) or ALLOW
    queue = store.resolve_queue(namespace, labels)
    if queue is None:
        return deny(no_queue_message(namespace, "JobFlow") + ", or set the JobFlow's spec.queue")
    denial = check_open(env, queue, namespace, labels, "JobFlow")
    if denial is not None:
        return denial
    return ALLOW
