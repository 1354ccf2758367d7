"""Slim cache records of JobFlows and JobTemplates, their converters and the
JobFlow spec parser.

They live in the cache (not in `arbiter.jobflow`) because the store holds
them and the cache imports nothing above it. The parser is shared by the
webhook (which denies what it rejects) and the JobFlow controller (which
marks a flow that slipped past the webhook Failed); `arbiter.jobflow.dag`
decides on the `Step`s it produces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from arbiter.cache.convert import ConversionError
from arbiter.core.api import QUEUE_LABEL, parse_time
from arbiter.core.jsonvalues import brief

Obj = dict[str, Any]
RetainPolicy = Literal["retain", "delete"]
Condition = Literal["Succeeded", "Failed", "Started"]
CONDITIONS: tuple[Condition, ...] = ("Succeeded", "Failed", "Started")


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a JobFlow's DAG, as its spec states it."""

    name: str
    # The JobTemplate instantiated; defaults to the step's name (as in Volcano).
    template: str
    targets: tuple[str, ...] = ()
    condition: Condition = "Succeeded"
    max_retries: int = 0


class FlowSpecError(ConversionError):
    """A JobFlow spec that cannot be read; the message names the field."""


@dataclass(frozen=True, slots=True)
class FlowSpec:
    steps: tuple[Step, ...]
    # Step name -> the overlay on its template's JobSpec.
    patches: Mapping[str, Obj] = field(default_factory=dict)
    retain_policy: RetainPolicy = "retain"
    queue: str | None = None


# Records are plain field lists: any likeness to other records is of shape only
# (deliberate; each names what its own kind needs).
@dataclass(frozen=True, slots=True)
class JobFlowRecord:
    namespace: str
    name: str
    uid: str
    spec: FlowSpec | None
    # Why `spec` is None.
    spec_error: str = ""
    generation: int = 0
    queue_label: str | None = None
    deleting: bool = False
    phase: str = ""
    # The raw status as last read: the controller's memory of attempts
    # whose Jobs are gone, and what it compares before writing.
    status: Mapping[str, Any] = field(default_factory=dict)
    created: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class JobTemplateRecord:
    namespace: str
    name: str
    uid: str
    # The batch/v1 JobSpec, needed whole to instantiate it.
    spec: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _int(value: object, where: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise FlowSpecError(f"{where}: {brief(value)} must be an integer")
    return value


# Like fairshare_scenario._name, but raising FlowSpecError: each reader keeps its
# own error type so its callers catch only their own.
def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise FlowSpecError(f"{where}: must be a non-empty string")
    return value


def parse_flow_spec(spec: object) -> FlowSpec:
    """spec of a JobFlow -> FlowSpec; FlowSpecError names the bad field."""
    if not isinstance(spec, dict):
        raise FlowSpecError("spec: must be an object")
    flows = spec.get("flows")
    if not isinstance(flows, list) or not flows:
        raise FlowSpecError("spec.flows: must be a non-empty list of steps")
    steps: list[Step] = []
    patches: dict[str, Obj] = {}
    for index, raw in enumerate(flows):
        where = f"spec.flows[{index}]"
        if not isinstance(raw, dict):
            raise FlowSpecError(f"{where}: must be an object")
        name = _text(raw.get("name"), f"{where}.name")
        template = raw.get("template")
        template = name if template is None else _text(template, f"{where}.template")
        depends = raw.get("dependsOn") or {}
        if not isinstance(depends, dict):
            raise FlowSpecError(f"{where}.dependsOn: must be an object")
        targets = depends.get("targets") or []
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise FlowSpecError(f"{where}.dependsOn.targets: must be a list of step names")
        condition = depends.get("condition") or "Succeeded"
        if condition not in CONDITIONS:
            raise FlowSpecError(
                f'{where}.dependsOn.condition: {brief(condition)} is not one of '
                + ", ".join(CONDITIONS))
        retries = _int(raw.get("maxRetries"), f"{where}.maxRetries", 0)
        if retries < 0:
            raise FlowSpecError(f"{where}.maxRetries: must be 0 or more")
        patch = raw.get("patch")
        if patch is not None:
            if not isinstance(patch, dict):
                raise FlowSpecError(f"{where}.patch: must be an object (a JobSpec overlay)")
            patches[name] = cast(Obj, patch)
        # A repeated target is one dependency (and is costly to check again).
        steps.append(Step(name=name, template=template, targets=tuple(dict.fromkeys(targets)),
                          condition=cast(Condition, condition), max_retries=retries))
    policy = spec.get("jobRetainPolicy") or "retain"
    if policy not in ("retain", "delete"):
        raise FlowSpecError(f'spec.jobRetainPolicy: {brief(policy)} is not one of retain, delete')
    queue = spec.get("queue")
    if queue is not None and not isinstance(queue, str):
        raise FlowSpecError("spec.queue: must be a string")
    return FlowSpec(steps=tuple(steps), patches=patches,
                    retain_policy=cast(RetainPolicy, policy), queue=queue or None)


def jobflow_from_api(obj: Mapping[str, Any]) -> JobFlowRecord:
    meta = cast(Mapping[str, Any], obj.get("metadata") or {})
    status = cast(Mapping[str, Any], obj.get("status") or {})
    state = status.get("state")
    try:
        spec: FlowSpec | None = parse_flow_spec(obj.get("spec"))
        error = ""
    except FlowSpecError as problem:
        spec, error = None, str(problem)
    labels = cast(Mapping[str, str], meta.get("labels") or {})
    return JobFlowRecord(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        spec=spec,
        spec_error=error,
        generation=int(meta.get("generation", 0) or 0),
        queue_label=labels.get(QUEUE_LABEL) or None,
        deleting=meta.get("deletionTimestamp") is not None,
        phase=str(state.get("phase", "")) if isinstance(state, dict) else "",
        status=status,
        created=parse_time(meta.get("creationTimestamp")),
    )


def jobtemplate_from_api(obj: Mapping[str, Any]) -> JobTemplateRecord:
    meta = cast(Mapping[str, Any], obj.get("metadata") or {})
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise ConversionError("spec: a JobTemplate's spec must be a JobSpec object")
    return JobTemplateRecord(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        spec=spec,
    )
