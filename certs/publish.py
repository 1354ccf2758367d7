"""Keeping the caBundle of arbiter's webhook configurations current."""

from __future__ import annotations

import base64
import logging
from typing import Any

from arbiter.base.kubeapi import ApiError, request_json

log = logging.getLogger(__name__)

COLLECTIONS = (
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
)
# cert-manager's CA injector owns the caBundle of configurations annotated so.
INJECTOR_ANNOTATION = "cert-manager.io/inject-ca-from"


def with_ca_bundle(configuration: dict[str, Any], ca_pem: bytes) -> bool:
    """Set every webhook's clientConfig.caBundle; True if anything changed."""
    encoded = base64.b64encode(ca_pem).decode()
    changed = False
    for hook in configuration.get("webhooks") or []:
        client = hook.setdefault("clientConfig", {})
        if client.get("caBundle") != encoded:
            client["caBundle"] = encoded
            changed = True
    return changed


async def publish_ca_bundle(api: Any, ca_pem: bytes, name: str = "kube-arbiter") -> int:
    """Update both configurations named `name`; returns how many were written."""
    written = 0
    for collection in COLLECTIONS:
        for _ in range(5):
            try:
                current = await request_json(api, "GET", f"{collection}/{name}")
            except ApiError as error:
                if error.status == 404:
                    break  # not installed (yet): nothing to keep in sync
                raise
            annotations = (current.get("metadata") or {}).get("annotations") or {}
            if INJECTOR_ANNOTATION in annotations or not with_ca_bundle(current, ca_pem):
                break
            try:
                await request_json(api, "PUT", f"{collection}/{name}", body=current)
            except ApiError as error:
                if error.status == 409:
                    continue
                raise
            written += 1
            log.info("published caBundle", extra={"configuration": f"{collection}/{name}"})
            break
    return written
