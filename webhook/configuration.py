"""The Mutating/ValidatingWebhookConfigurations arbiter owns.

`desired_configurations` derives them from the endpoint table the server
serves (`webhook.endpoints`), with the one definition of selectors (which
follow `--managed-namespaces`) and failure policy; manifests/webhooks.yaml
is the same content (for `all`) pointing at the Service (a test keeps the
two equal). With `--webhook-url` the server installs them itself (`install`)
and keeps their caBundle current after a certificate rotation (certs.publish).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable
from typing import Any

from arbiter.base.kubeapi import ApiError, request_json
from arbiter.core.api import MANAGED_LABEL, ManagedNamespaces
from arbiter.integrations import OPTIONAL
from webhook.endpoints import Endpoint, Hook, served

log = logging.getLogger(__name__)

CONFIGURATION_NAME = "kube-arbiter"
MUTATING_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
TIMEOUT_SECONDS = 3
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

Json = dict[str, Any]


def namespace_selector(excluded: Iterable[str], managed: ManagedNamespaces = "all") -> Json:
    """The namespaces the apiserver sends to arbiter (DESIGN §3): with `all`
    every one not excluded nor labelled out; with `listed` only those
    labelled in (arbiter labels the ones its Queues admit)."""
    opt = ({"key": MANAGED_LABEL, "operator": "In", "values": ["true"]} if managed == "listed"
           else {"key": MANAGED_LABEL, "operator": "NotIn", "values": ["false"]})
    return {
        "matchExpressions": [
            {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": sorted(set(excluded))},
            opt,
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


# Hooks arbiter's own requests may skip, and for which operations: its
# QueueUnits are written whole (labels, pod sets) and checked by the CRD
# schema; an update to a Job or a pod gate by arbiter is allowed anyway. Its
# own Job creations (JobFlow steps) still go through jobs.mutate/validate.
OWN_WRITES_SKIP: dict[str, str] = {
    "queueunits.mutate.arbiter.dev": "all",
    "queueunits.validate.arbiter.dev": "all",
    "queueunit-status.validate.arbiter.dev": "all",
    "jobs.validate.arbiter.dev": "updates",
    "pod-gates.validate.arbiter.dev": "all",
    "pod-labels.validate.arbiter.dev": "all",
    # Unsuspending a workload and writing its placement (the loop's updates).
    **{f"{i.resource}.validate.arbiter.dev": "updates" for i in OPTIONAL},
}


def service_account_username(namespace: str, name: str) -> str:
    """The username a ServiceAccount's requests carry (manifests/webhooks.yaml
    names arbiter's own: arbiter-system/kube-arbiter)."""
    return f"system:serviceaccount:{namespace}:{name}"


def _not_from(hook: Hook, usernames: Iterable[str]) -> dict[str, str] | None:
    """A matchCondition that keeps these users' requests away from `hook`."""
    names = sorted(set(usernames))
    which = OWN_WRITES_SKIP.get(hook.name)
    if not names or which is None:
        return None
    listed = ", ".join(json.dumps(name) for name in names)
    expression = f"!(request.userInfo.username in [{listed}])"
    if which == "updates":
        expression = f"request.operation != 'UPDATE' || {expression}"
    return {"name": "not-kube-arbiter", "expression": expression}


def _webhook(endpoint: Endpoint, hook: Hook, client_config: Json, selector: Json,
             own_usernames: Iterable[str] = ()) -> Json:
    entry: Json = {
        "name": hook.name,
        "clientConfig": client_config,
        "rules": [{"apiGroups": [endpoint.group], "apiVersions": [endpoint.version],
                   "resources": [f"{endpoint.resource}/{hook.subresource}"
                                 if hook.subresource else endpoint.resource],
                   "operations": list(hook.operations),
                   "scope": "Namespaced" if endpoint.namespaced else "Cluster"}],
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "admissionReviewVersions": ["v1"],
    }
    if endpoint.namespaced:
        entry["namespaceSelector"] = selector
    skip = _not_from(hook, own_usernames)
    conditions = [] if skip is None else [skip]
    if hook.condition is not None:
        name, expression = hook.condition
        conditions.append({"name": name, "expression": expression})
    if conditions:
        entry["matchConditions"] = conditions
    if endpoint.mutating:
        entry["reinvocationPolicy"] = "Never"
    return entry


def desired_configurations(
    *,
    url: str | None = None,
    service: tuple[str, str] | None = None,
    ca_bundle: bytes | None = None,
    excluded_namespaces: Iterable[str],
    name: str = CONFIGURATION_NAME,
    own_usernames: Iterable[str] = (),
    managed: ManagedNamespaces = "all",
) -> tuple[Json, Json]:
    """(MutatingWebhookConfiguration, ValidatingWebhookConfiguration): one
    webhook per hook of each endpoint the server serves, in table order.

    `own_usernames`: arbiter's own writes (its QueueUnits, unsuspending a
    Job, removing a gate) skip the hooks of `OWN_WRITES_SKIP`: each such call
    was a round trip through this same process in the middle of an
    admission (three of the seven webhook calls one Job's admission made)."""
    selector = namespace_selector(excluded_namespaces, managed)
    labels = {"app.kubernetes.io/name": "kube-arbiter",
              "app.kubernetes.io/managed-by": "kube-arbiter"}

    def configuration(kind: str, mutating: bool) -> Json:
        webhooks = [_webhook(endpoint, hook,
                             _client_config(endpoint.path, url, service, ca_bundle), selector,
                             own_usernames)
                    for endpoint in served() if endpoint.mutating == mutating
                    for hook in endpoint.hooks]
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                "metadata": {"name": name, "labels": labels}, "webhooks": webhooks}

    return (configuration("MutatingWebhookConfiguration", True),
            configuration("ValidatingWebhookConfiguration", False))


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
