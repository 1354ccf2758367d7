"""Per-namespace limits (issue #25 row 9), checked before a kind's own
validation, for everyone but arbiter:

- **resource names per unit** (`--max-resource-names`, default 16): a pod,
  a Job's pod template or a QueueUnit whose requests (and limits, which
  become requests) name more resources than that is denied, with the
  field. Every name is a slot in the engine's vectors and the status it
  writes; without a bound one tenant's made-up names slow every queue's
  status pass.
- **units per namespace** (`--max-units-per-namespace`, default 10,000):
  new work (a Job, a pod that is not a Job's, a QueueUnit) in a namespace
  whose QueueUnits (the cache's count) have reached the limit is denied.

One wrapper around the validating decisions of pods, Jobs, QueueUnits and
the integrations' workloads (`webhook.endpoints`), so those kinds' modules
stay as they are. A child of a held workload (a JobSet's Job, a
StatefulSet's pod: `webhook.held.held_root`) makes no unit of its own, so
the unit count does not stop it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from arbiter.integrations import BY_KIND, OPTIONAL, Integration
from arbiter.integrations.base import dig
from webhook import pods
from webhook.held import held_root
from webhook.review import (
    AdmissionEnv,
    AdmissionRequest,
    Decision,
    deny,
    namespaced_object,
    text_field,
)

Decide = Callable[[AdmissionRequest, AdmissionEnv], Decision]


def _keys(value: Any) -> Iterable[str]:
    return (k for k in value if isinstance(k, str)) if isinstance(value, dict) else ()


def _resources_names(resources: Any) -> set[str]:
    if not isinstance(resources, dict):
        return set()
    return {*_keys(resources.get("requests")), *_keys(resources.get("limits"))}


def pod_spec_names(spec: Any) -> set[str]:
    """The resources a pod spec requests (containers, init containers, the
    pod-level resources and overhead), requests and limits alike."""
    if not isinstance(spec, dict):
        return set()
    names = _resources_names(spec.get("resources")) | set(_keys(spec.get("overhead")))
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        for container in containers if isinstance(containers, list) else ():
            if isinstance(container, dict):
                names |= _resources_names(container.get("resources"))
    return names


def unit_spec_names(spec: Any) -> set[str]:
    """The resources a QueueUnit's pod sets (or resourceUnit) request."""
    if not isinstance(spec, dict):
        return set()
    names = set(_keys(spec.get("resourceUnit")))
    pod_sets = spec.get("podSets")
    for pod_set in pod_sets if isinstance(pod_sets, list) else ():
        if isinstance(pod_set, dict):
            names |= set(_keys(pod_set.get("requests")))
    return names


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


# kind -> (the field holding what a unit requests, its names from the object).
_WHERE: dict[str, tuple[str, Callable[[Any], set[str]]]] = {
    "Pod": ("spec", lambda obj: pod_spec_names(_get(obj, "spec"))),
    "Job": ("spec.template.spec", lambda obj: pod_spec_names(_get(obj, "spec", "template",
                                                                  "spec"))),
    "QueueUnit": ("spec.podSets[].requests",
                  lambda obj: unit_spec_names(_get(obj, "spec"))),
}


def _template_names(integration: Integration) -> Callable[[Any], set[str]]:
    def names(obj: Any) -> set[str]:
        if not isinstance(obj, dict):
            return set()
        found: set[str] = set()
        for path in integration.templates(obj):
            found |= pod_spec_names(dig(obj, (*path, "spec")))
        return found
    return names


# A workload is one unit (or one per group) of all its pod templates.
_WHERE.update({i.kind: ("its pod templates' specs", _template_names(i)) for i in OPTIONAL})


def limited(decide: Decide, kind: str) -> Decide:
    """`decide`, after the per-namespace limits for `kind`."""
    field, names_of = _WHERE.get(kind) or ("its pod templates' specs",
                                           _template_names(BY_KIND[kind]))  # a declared kind

    def checked(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
        if (request.operation not in ("CREATE", "UPDATE") or request.sub_resource
                or env.is_arbiter(request)):
            return decide(request, env)
        obj, meta, labels, namespace = namespaced_object(request, kind)
        if not env.store.is_managed_namespace(namespace):
            return decide(request, env)
        name = request.name or text_field(meta, "name")
        subject = f'{kind} "{namespace}/{name}"' if name else f'{kind} in "{namespace}"'
        job_pod = kind == "Pod" and pods.managed_job_pod(env, namespace, meta, labels) is True
        # A unit's ownerRef proves nothing (it is not a workload's child).
        child = job_pod or (kind != "QueueUnit" and held_root(env, namespace, meta) is not None)
        denial = (None if job_pod else _names_denial(env, subject, field, names_of(obj))) or (
            _units_denial(env, subject, namespace)
            if request.operation == "CREATE" and not child else None)
        return denial or decide(request, env)

    return checked


def _names_denial(env: AdmissionEnv, subject: str, field: str,
                  names: set[str]) -> Decision | None:
    limit = env.max_resource_names
    if len(names) <= limit:
        return None
    shown = ", ".join(sorted(names)[:5])
    return deny(f"{subject}: {field} names {len(names)} resources ({shown}, …); at most "
                f"{limit} are allowed per unit (--max-resource-names)", code=422)


def _units_denial(env: AdmissionEnv, subject: str, namespace: str) -> Decision | None:
    held = env.store.units_per_namespace.get(namespace, 0)
    limit = env.max_units_per_namespace
    if held < limit:
        return None
    return deny(f'{subject}: namespace "{namespace}" holds {held} QueueUnits, the most '
                f"allowed (--max-units-per-namespace {limit}); delete finished Jobs, pods "
                "or QueueUnits first")

