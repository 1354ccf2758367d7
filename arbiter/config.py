"""Configuration of `arbiter serve`: one frozen record built from flags/env."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from arbiter.cache.store import DEFAULT_EXCLUDED_NAMESPACES


@dataclass(frozen=True, slots=True)
class ServeConfig:
    host: str = "0.0.0.0"
    port: int = 9443
    cert_dir: Path = Path("/tmp/arbiter-certs")
    # Where the apiserver reaches the webhook (https://host:port). When set,
    # arbiter installs and owns its webhook configurations with this URL.
    webhook_url: str | None = None
    # The Service the webhook configurations point at, when no URL is given.
    service_name: str = "kube-arbiter"
    namespace: str = "arbiter-system"
    kubeconfig: Path | None = None
    excluded_namespaces: tuple[str, ...] = DEFAULT_EXCLUDED_NAMESPACES
    overcommit: float = 1.0
    leader_elect: bool = True
    lease_name: str = "kube-arbiter"
    identity: str = ""
    # Seconds a reclaiming queue waits before taking resources back.
    reclaim_grace: float = 30.0
    # Seconds an admitted unit may take to start Running before backoff.
    admission_timeout: float = 300.0
    # Minimum seconds between two status writes of one object.
    status_interval: float = 2.0
    max_body_bytes: int = 3 * 1024 * 1024
    extra: dict[str, str] = field(default_factory=dict)
