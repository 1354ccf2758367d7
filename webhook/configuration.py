"""The Mutating/ValidatingWebhookConfigurations arbiter owns.

`desired_configurations` is the single definition of rules, selectors and
failure policy; manifests/webhooks.yaml is the same content pointing at the
Service (a test keeps the two equal). With `--webhook-url` the server
installs them itself (`install`) and keeps their caBundle current after a
certificate rotation (certs.publish).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable
from typing import Any

from arbiter.api import ADMISSION_GATE, MANAGED_LABEL, QUEUE_LABEL
from arbiter.kubeapi import ApiError, request_json

log = logging.getLogger(__name__)

CONFIGURATION_NAME = "kube-arbiter"
MUTATING_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
TIMEOUT_SECONDS = 3
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# UPDATE of a pod reaches arbiter only while the pod holds arbiter's gate.
HELD_POD_CONDITION = (
    "has(oldObject.spec.schedulingGates) && "
    f"oldObject.spec.schedulingGates.exists(g, g.name == '{ADMISSION_GATE}')"
)
# UPDATE of a Job reaches arbiter only when arbiter manages it (queue label).
MANAGED_JOB_CONDITION = (
    "request.operation == 'CREATE' || (has(oldObject.metadata.labels) && "
    f"'{QUEUE_LABEL}' in oldObject.metadata.labels)"
)

Json = dict[str, Any]


def namespace_selector(excluded: Iterable[str]) -> Json:
    return {
        "matchExpressions": [
            {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": sorted(set(excluded))},
            {"key": MANAGED_LABEL, "operator": "NotIn", "values": ["false"]},
        ]
    }


def _client_config(path: str, url: str | None, service: tuple[str, str] | None,
                   ca_bundle: bytes | None) -> Json:
    config: Json
    if url is not None:
        config = {"url": url.rstrip("/") + path}
    elif service is not None:
        config = {"service": {"namespace": service[0], "name": service[1], "path": path,
                              "port": 443}}
    else:
        raise ValueError("either a webhook URL or a Service is needed")
    if ca_bundle:
        config["caBundle"] = base64.b64encode(ca_bundle).decode()
    return config


def _rule(group: str, version: str, resource: str, operations: list[str], scope: str) -> Json:
    return {"apiGroups": [group], "apiVersions": [version], "resources": [resource],
            "operations": operations, "scope": scope}


def desired_configurations(
    *,
    url: str | None = None,
    service: tuple[str, str] | None = None,
    ca_bundle: bytes | None = None,
    excluded_namespaces: Iterable[str],
    name: str = CONFIGURATION_NAME,
) -> tuple[Json, Json]:
    """(MutatingWebhookConfiguration, ValidatingWebhookConfiguration)."""
    selector = namespace_selector(excluded_namespaces)

    def hook(hook_name: str, path: str, rule: Json, *, namespaced: bool = True,
             conditions: list[Json] | None = None, mutating: bool = False) -> Json:
        entry: Json = {
            "name": hook_name,
            "clientConfig": _client_config(path, url, service, ca_bundle),
            "rules": [rule],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": TIMEOUT_SECONDS,
            "admissionReviewVersions": ["v1"],
        }
        if namespaced:
            entry["namespaceSelector"] = selector
        if conditions:
            entry["matchConditions"] = conditions
        if mutating:
            entry["reinvocationPolicy"] = "Never"
        return entry

    labels = {"app.kubernetes.io/name": "kube-arbiter",
              "app.kubernetes.io/managed-by": "kube-arbiter"}
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": labels},
        "webhooks": [
            hook("pods.mutate.arbiter.dev", "/webhook/mutate/pods",
                 _rule("", "v1", "pods", ["CREATE"], "Namespaced"), mutating=True),
            hook("jobs.mutate.arbiter.dev", "/webhook/mutate/jobs",
                 _rule("batch", "v1", "jobs", ["CREATE"], "Namespaced"), mutating=True),
            hook("queueunits.mutate.arbiter.dev", "/webhook/mutate/queueunits",
                 _rule("arbiter.dev", "v1alpha1", "queueunits", ["CREATE", "UPDATE"],
                       "Namespaced"), mutating=True),
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": labels},
        "webhooks": [
            hook("pods.validate.arbiter.dev", "/webhook/validate/pods",
                 _rule("", "v1", "pods", ["CREATE"], "Namespaced")),
            hook("pod-gates.validate.arbiter.dev", "/webhook/validate/pods",
                 _rule("", "v1", "pods", ["UPDATE"], "Namespaced"),
                 conditions=[{"name": "held-by-arbiter", "expression": HELD_POD_CONDITION}]),
            hook("jobs.validate.arbiter.dev", "/webhook/validate/jobs",
                 _rule("batch", "v1", "jobs", ["CREATE", "UPDATE"], "Namespaced"),
                 conditions=[{"name": "managed-by-arbiter",
                              "expression": MANAGED_JOB_CONDITION}]),
            hook("queues.validate.arbiter.dev", "/webhook/validate/queues",
                 _rule("arbiter.dev", "v1alpha1", "queues", ["CREATE", "UPDATE", "DELETE"],
                       "Cluster"), namespaced=False),
            hook("queueunits.validate.arbiter.dev", "/webhook/validate/queueunits",
                 _rule("arbiter.dev", "v1alpha1", "queueunits", ["CREATE", "UPDATE"],
                       "Namespaced")),
            hook("jobflows.validate.arbiter.dev", "/webhook/validate/jobflows",
                 _rule("arbiter.dev", "v1alpha1", "jobflows", ["CREATE", "UPDATE"],
                       "Namespaced")),
        ],
    }
    return mutating, validating


async def _apply(api: Any, collection: str, desired: Json) -> None:
    name = desired["metadata"]["name"]
    for _ in range(5):
        try:
            current = await request_json(api, "GET", f"{collection}/{name}")
        except ApiError as error:
            if error.status != 404:
                raise
            try:
                await request_json(api, "POST", collection, body=desired)
                log.info("created webhook configuration",
                         extra={"kind": desired["kind"], "configuration": name})
                return
            except ApiError as create_error:
                if create_error.status == 409:
                    continue
                raise
        body = dict(desired)
        body["metadata"] = {**desired["metadata"],
                            "resourceVersion": current["metadata"]["resourceVersion"]}
        try:
            await request_json(api, "PUT", f"{collection}/{name}", body=body)
            log.info("updated webhook configuration", extra={"kind": desired["kind"],
                                                             "configuration": name})
            return
        except ApiError as error:
            if error.status != 409:
                raise
    raise ApiError(409, "Conflict", f"could not update {desired['kind']} {name}: conflicts")


async def install(api: Any, mutating: Json, validating: Json) -> None:
    """Create or replace both configurations (idempotent)."""
    await _apply(api, MUTATING_PATH, mutating)
    await _apply(api, VALIDATING_PATH, validating)
