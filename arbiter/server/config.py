"""Configuration of `arbiter serve`: one frozen record built from flags/env."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from arbiter.cache.store import DEFAULT_EXCLUDED_NAMESPACES
from arbiter.core.api import ManagedNamespaces
from arbiter.integrations import DEFAULT_NAMES as DEFAULT_INTEGRATIONS
from arbiter.integrations.declared import Declaration


@dataclass(frozen=True, slots=True)
class ServeConfig:
    host: str = "0.0.0.0"
    # The webhook's HTTPS listener (also /healthz, /readyz, /metrics).
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
    # Which namespaces arbiter manages (DESIGN §3): "all" but the excluded
    # and those labelled arbiter.dev/managed: "false"; or only those "listed"
    # (admitted by a Queue, or labelled arbiter.dev/managed: "true").
    managed_namespaces: ManagedNamespaces = "all"
    # Workload integrations switched on (arbiter.integrations; DESIGN §14).
    integrations: tuple[str, ...] = DEFAULT_INTEGRATIONS
    # Kinds declared in --integration-file (arbiter.integrations.declared).
    declared: tuple[Declaration, ...] = ()
    overcommit: float = 1.0
    leader_elect: bool = True
    lease_name: str = "kube-arbiter"
    identity: str = ""
    # Seconds a reclaiming queue waits before taking resources back.
    reclaim_grace: float = 30.0
    # Seconds PodDisruptionBudgets may block a reclaim before pods are deleted.
    reclaim_pdb_timeout: float = 300.0
    # Seconds an admitted unit may take to start Running before backoff.
    admission_timeout: float = 300.0
    # Minimum seconds between two status writes of one object.
    status_interval: float = 2.0
    max_body_bytes: int = 3 * 1024 * 1024
    # Scheduler extender (extender/): seconds a pod approved by filter counts
    # against its queue's capability before its binding is seen.
    extender_assume_ttl: float = 30.0
    # prioritize: weights of gang locality and bin-packing in the 0..10 score.
    extender_locality_weight: int = 1
    extender_binpack_weight: int = 1
    # Bodies with full Node lists (an extender not nodeCacheCapable) are large.
    extender_max_body_bytes: int = 64 * 1024 * 1024
    # The extender's own HTTPS listener (DESIGN §13), and the CA whose client
    # certificates it requires (kube-scheduler's tlsConfig certFile/keyFile);
    # None: any client is served, with a warning at start.
    extender_port: int = 9444
    extender_client_ca: Path | None = None
    # With a client CA: the commonNames allowed to call the extender (that
    # CA may sign other clients too); empty: any certificate it signed.
    extender_client_names: tuple[str, ...] = ("system:kube-scheduler",)
    # The metrics/health HTTPS listener (/metrics, /healthz, /readyz and, when
    # debug_api is not "off", /debug/...: "loopback" answers clients on this
    # host only, "token" bearer tokens reviewed with the apiserver).
    metrics_port: int = 9445
    debug_api: str = "off"
    # The read-only web view at /view/ on the metrics listener (DESIGN §15):
    # "off", "loopback" or "token", as debug_api (arbiter.server.web).
    web_view: str = "off"
    # Per listener (webhook, extender, metrics): open connections, and the
    # seconds a TLS handshake, the first request head and an idle
    # keep-alive connection may take (arbiter.base.httpserve.ListenerLimits).
    listener_max_connections: int = 512
    listener_max_connections_per_source: int = 128
    listener_handshake_timeout: float = 5.0
    listener_header_timeout: float = 10.0
    listener_idle_timeout: float = 60.0
    # Per namespace (webhook.limits): resource names one unit may request;
    # QueueUnits a namespace may hold before new work there is denied.
    max_resource_names: int = 16
    max_units_per_namespace: int = 10_000
    # Webhook server and certificates (webhook/, certs/, arbiter/server/app.py).
    # Secret (in `namespace`) that stores the CA and serving certificate, so
    # replicas share them and restarts keep the caBundle; None: cert_dir only.
    cert_secret: str | None = None
    # Seconds between checks for a renewed or externally replaced certificate.
    cert_check_interval: float = 60.0
    # Usernames arbiter's own requests carry, when SelfSubjectReview is not
    # available (learned at startup otherwise).
    usernames: tuple[str, ...] = ()
    log_level: str = "INFO"
    # Admission loop (arbiter/loop/). Leader election timing (client-go's
    # defaults); backoff after an admission timed out (base doubles per
    # attempt, capped, plus up to 50 % jitter); status writes per second in
    # all; Events per second.
    lease_duration: float = 15.0
    lease_renew_deadline: float = 10.0
    lease_retry_period: float = 2.0
    backoff_base: float = 10.0
    backoff_max: float = 600.0
    status_qps: float = 20.0
    event_qps: float = 20.0
    # API writes the admission loop keeps in flight at once.
    loop_concurrency: int = 100
    # Admission at creation (DESIGN §16): the leader's webhook lets a Job
    # through admitted when its queue would admit it next (--admit-on-create=false:
    # every Job is held).
    admit_on_create: bool = True
    # Tests only: seconds before the unit of a Job admitted at creation is written.
    fast_path_unit_delay: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)
