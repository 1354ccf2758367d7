"""A declared kind for tests (`Widget`: a driver and workers, counts at
different paths), its CRD, its objects, and registering it for a test."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from arbiter.core.api import QUEUE_LABEL
from arbiter.integrations import BY_KIND
from arbiter.integrations.declared import DeclaredIntegration, build, parse
from arbiter.server import declared as server_declared

Json = dict[str, Any]
GROUP = "example.com"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/team-a/widgets"


def declaration(**changes: Any) -> Json:
    entry: Json = {
        "group": GROUP, "version": "v1", "kind": "Widget", "resource": "widgets",
        "suspendPath": "spec.suspend",
        "podSets": [
            {"name": "driver", "countPath": "spec.driver.replicas",
             "templatePath": "spec.driver.template"},
            {"name": "workers", "countPath": "spec.workers.count",
             "templatePath": "spec.workers.template"}],
        "finishedConditions": ["Complete"], "failedConditions": ["Failed"]}
    entry.update(changes)
    return entry


def file_of(*entries: Json) -> Json:
    return {"integrations": list(entries or (declaration(),))}


def widget_integration(**changes: Any) -> DeclaredIntegration:
    (integration,) = build(parse(file_of(declaration(**changes)), BY_KIND.values()))
    return integration


@contextmanager
def registered(*integrations: DeclaredIntegration) -> Iterator[tuple[DeclaredIntegration, ...]]:
    """These kinds (default: Widget) in every registry for the block."""
    items = integrations or (widget_integration(),)
    server_declared.register(items)
    try:
        yield items
    finally:
        server_declared.register(items, on=False)


def _open(**extra: Any) -> Json:
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True, **extra}


def pod_template_schema() -> Json:
    return {"type": "object", "properties": {
        "metadata": _open(),
        "spec": _open(properties={"containers": {"type": "array", "items": _open()}})}}


def crd(**schema_changes: Any) -> Json:
    """The Widget CRD; `schema_changes` replace properties of spec."""
    spec_properties: Json = {
        "suspend": {"type": "boolean"},
        "driver": {"type": "object", "properties": {
            "replicas": {"type": "integer"}, "template": pod_template_schema()}},
        "workers": {"type": "object", "properties": {
            "count": {"type": "integer"}, "template": pod_template_schema()}}}
    spec_properties.update(schema_changes)
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{GROUP}"},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"kind": "Widget", "plural": "widgets"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {
                                       "type": "object", "properties": {
                                           "spec": {"type": "object",
                                                    "properties": spec_properties},
                                           "status": _open()}}}}]}}


def pod_template(cpu: str = "1", queue: str | None = None) -> Json:
    template: Json = {"spec": {"containers": [
        {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}}
    if queue is not None:
        template["metadata"] = {"labels": {QUEUE_LABEL: queue}}
    return template


def widget(name: str, namespace: str = "team-a", *, driver: int = 1, workers: int = 2,
           suspend: bool | None = None, queue: str | None = None,
           uid: str | None = None) -> Json:
    spec: Json = {"driver": {"replicas": driver, "template": pod_template(queue=queue)},
                  "workers": {"count": workers, "template": pod_template(queue=queue)}}
    if suspend is not None:
        spec["suspend"] = suspend
    meta: Json = {"name": name, "namespace": namespace}
    if queue is not None:
        meta["labels"] = {QUEUE_LABEL: queue}
    if uid is not None:
        meta["uid"] = uid
    return {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": meta, "spec": spec}


def with_changes(obj: Json, *path_and_value: Any) -> Json:
    """A copy of `obj` with the value at path (all but the last item) set."""
    result = copy.deepcopy(obj)
    *path, value = path_and_value
    target = result
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return result
