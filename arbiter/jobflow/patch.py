"""From a JobTemplate and a step to a Job: the overlay and the Job's shape.

`merge` is a strategic-merge-style overlay, enough for what a step changes
on a shared template (image tag, args, env, parallelism): maps merge
recursively, a `null` removes the key, lists of objects that Kubernetes
merges by a key (containers by name, env by name, volumeMounts by
mountPath, ...) merge item by item, every other list (args, command,
tolerations) is replaced. A list item `{"$patch": "delete", <key>: ...}`
removes the item with that key.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from arbiter.core.api import (
    ADMISSION_GATE,
    API_VERSION,
    ATTEMPT_ANNOTATION,
    FLOW_ANNOTATION,
    FLOW_LABEL,
    FLOW_UID_ANNOTATION,
    JOB_FLOW,
    JOB_TEMPLATE,
    QUEUE_LABEL,
    STEP_ANNOTATION,
    STEP_LABEL,
)

Obj = dict[str, Any]

# Field name -> the key Kubernetes' strategic merge patch merges its items by.
MERGE_KEYS: Mapping[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "resourceClaims": "name",
}

# What the Job controller adds to a Job it owns the selector of; a template
# copied from a live Job must lose them or the new Job is rejected.
JOB_CONTROLLER_LABELS: tuple[str, ...] = (
    "controller-uid",
    "job-name",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
)


def merge(base: Any, overlay: Any, field: str = "") -> Any:
    """`overlay` applied on `base`; neither is modified."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        result = copy.deepcopy(base)
        for key, value in overlay.items():
            if value is None:
                result.pop(key, None)
            elif key in result:
                result[key] = merge(result[key], value, key)
            else:
                result[key] = _without_directives(value)
        return result
    if isinstance(base, list) and isinstance(overlay, list) and MERGE_KEYS.get(field):
        return _merge_list(base, overlay, MERGE_KEYS[field])
    return _without_directives(overlay)


def _merge_list(base: list[Any], overlay: list[Any], key: str) -> list[Any]:
    if not all(isinstance(item, dict) and key in item for item in [*base, *overlay]):
        return [_without_directives(item) for item in overlay
                if not (isinstance(item, dict) and item.get("$patch") == "delete")]
    result = [copy.deepcopy(item) for item in base]
    index = {item[key]: position for position, item in enumerate(result)}
    deleted: set[int] = set()
    for item in overlay:
        position = index.get(item[key])
        if item.get("$patch") == "delete":
            if position is not None:
                deleted.add(position)
        elif position is None:
            index[item[key]] = len(result)
            result.append(_without_directives(item))
        else:
            result[position] = merge(result[position], item)
    return [item for position, item in enumerate(result) if position not in deleted]


def _without_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_directives(v) for k, v in value.items()
                if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_without_directives(v) for v in value
                if not (isinstance(v, dict) and v.get("$patch") == "delete")]
    return value


def clean_job_spec(spec: Mapping[str, Any]) -> Obj:
    """A JobSpec fit to create a new Job: no generated selector or labels.

    A user-chosen selector (`manualSelector: true`) is kept. `suspend` goes
    too: arbiter's webhook suspends every managed Job and its queue decides
    when it runs.
    """
    result: Obj = copy.deepcopy(dict(spec))
    result.pop("suspend", None)
    if not result.get("manualSelector"):
        result.pop("selector", None)
        result.pop("manualSelector", None)
        template = result.get("template")
        meta = template.get("metadata") if isinstance(template, dict) else None
        labels = meta.get("labels") if isinstance(meta, dict) else None
        if isinstance(meta, dict) and isinstance(labels, dict):
            for key in JOB_CONTROLLER_LABELS:
                labels.pop(key, None)
            if not labels:
                del meta["labels"]
    return result


def build_job(
    *,
    flow: str,
    flow_uid: str,
    namespace: str,
    step: str,
    attempt: int,
    name: str,
    template_spec: Mapping[str, Any],
    patch: Mapping[str, Any] | None,
    queue: str | None,
) -> Obj:
    """The Job of one step attempt: template + patch, labelled and owned."""
    spec = clean_job_spec(merge(dict(template_spec), dict(patch or {}), "spec"))
    labels = {FLOW_LABEL: flow, STEP_LABEL: step}
    if queue:
        labels[QUEUE_LABEL] = queue
        template = spec.setdefault("template", {})
        if isinstance(template, dict):
            meta = template.setdefault("metadata", {})
            if isinstance(meta, dict):
                meta.setdefault("labels", {})[QUEUE_LABEL] = queue
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                FLOW_ANNOTATION: flow,
                FLOW_UID_ANNOTATION: flow_uid,
                STEP_ANNOTATION: step,
                ATTEMPT_ANNOTATION: str(attempt),
            },
            "ownerReferences": [{
                "apiVersion": API_VERSION,
                "kind": JOB_FLOW.kind,
                "name": flow,
                "uid": flow_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }],
        },
        "spec": spec,
    }


def job_from_template(template: Mapping[str, Any], name: str | None = None) -> Obj:
    """`arbiter flow to-job`: a plain Job from a JobTemplate object."""
    meta = template.get("metadata") or {}
    job_meta: Obj = {"name": name or meta.get("name", "")}
    if meta.get("namespace"):
        job_meta["namespace"] = meta["namespace"]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta,
            "spec": clean_job_spec(template.get("spec") or {})}


def template_from_job(job: Mapping[str, Any], name: str | None = None) -> Obj:
    """`arbiter flow from-job`: a JobTemplate from a live Job.

    Drops status, identity and server-set metadata, the selector and the
    labels the Job controller added, and what arbiter added (suspend, the
    queue label and gate, the flow labels)."""
    meta = job.get("metadata") or {}
    spec = clean_job_spec(job.get("spec") or {})
    template = spec.get("template")
    if isinstance(template, dict):
        pod_meta = template.get("metadata")
        if isinstance(pod_meta, dict):
            labels = pod_meta.get("labels")
            if isinstance(labels, dict):
                for key in (QUEUE_LABEL, FLOW_LABEL, STEP_LABEL):
                    labels.pop(key, None)
                if not labels:
                    del pod_meta["labels"]
            pod_meta.pop("creationTimestamp", None)
            if not pod_meta:
                del template["metadata"]
        pod_spec = template.get("spec")
        if isinstance(pod_spec, dict) and isinstance(pod_spec.get("schedulingGates"), list):
            gates = [g for g in pod_spec["schedulingGates"]
                     if not (isinstance(g, dict) and g.get("name") == ADMISSION_GATE)]
            if gates:
                pod_spec["schedulingGates"] = gates
            else:
                del pod_spec["schedulingGates"]
    out_meta: Obj = {"name": name or meta.get("name", "")}
    if meta.get("namespace"):
        out_meta["namespace"] = meta["namespace"]
    kept_labels = {k: v for k, v in (meta.get("labels") or {}).items()
                   if k not in JOB_CONTROLLER_LABELS
                   and k not in (QUEUE_LABEL, FLOW_LABEL, STEP_LABEL)}
    if kept_labels:
        out_meta["labels"] = kept_labels
    return {"apiVersion": API_VERSION, "kind": JOB_TEMPLATE.kind, "metadata": out_meta,
            "spec": spec}
