"""Keeping the CA and serving certificate in a Secret.

Replicas then share one CA (one caBundle), and a restarted pod keeps it.
The Secret has type kubernetes.io/tls with the extra keys ca.crt and
ca.key; the files in the certificate directory mirror it.
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

from arbiter.base.kubeapi import ApiError, request_json
from certs.authority import CertificatePaths, write_private

log = logging.getLogger(__name__)

KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")


def _path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{namespace}/secrets"
    return f"{base}/{name}" if name else base


def read_files(paths: CertificatePaths) -> dict[str, bytes]:
    files = {"ca.crt": paths.ca_file, "ca.key": paths.ca_key_file,
             "tls.crt": paths.cert_file, "tls.key": paths.key_file}
    return {key: path.read_bytes() for key, path in files.items() if path.exists()}


def _write_files(directory: Path, data: dict[str, bytes]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        write_private(directory / key, value)


async def load(api: Any, namespace: str, name: str,
               directory: Path) -> tuple[str | None, dict[str, bytes]]:
    """Write the Secret's files into `directory`.

    Returns its resourceVersion and the files it holds; (None, {}) if it is absent.
    """
    try:
        secret = await request_json(api, "GET", _path(namespace, name))
    except ApiError as error:
        if error.status == 404:
            return None, {}
        raise
    raw = secret.get("data") or {}
    data = {key: base64.b64decode(raw[key]) for key in KEYS if key in raw}
    _write_files(directory, data)
    return str((secret.get("metadata") or {}).get("resourceVersion", "")), data


async def store(api: Any, namespace: str, name: str, paths: CertificatePaths,
                resource_version: str | None) -> str:
    """Create or replace the Secret from the files; raises ApiError 409 on a lost race."""
    data = {key: base64.b64encode(value).decode() for key, value in read_files(paths).items()}
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "kube-arbiter"}},
        "data": data,
    }
    if resource_version is None:
        answer = await request_json(api, "POST", _path(namespace), body=body)
    else:
        body["metadata"]["resourceVersion"] = resource_version
        answer = await request_json(api, "PUT", _path(namespace, name), body=body)
    log.info("stored certificates in Secret", extra={"secret": f"{namespace}/{name}"})
    return str((answer.get("metadata") or {}).get("resourceVersion", ""))
