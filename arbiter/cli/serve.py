"""`arbiter serve`: run the webhook / extender / loop server.

Every flag has an environment variable ARBITER_<FLAG> (dashes as
underscores) as its default, so a Deployment can configure it either way.
Logs are JSON, one object per line: ts, level, logger, msg and the event's
extra fields.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import math
import os
import socket
import sys
from pathlib import Path
from typing import Any

import orjson

from arbiter.cache.store import DEFAULT_EXCLUDED_NAMESPACES
from arbiter.core.api import MANAGED_NAMESPACE_MODES
from arbiter.integrations import DEFAULT_NAMES as INTEGRATION_NAMES
from arbiter.integrations import parse_names as parse_integrations
from arbiter.integrations.declared import Declaration, DeclarationError
from arbiter.server.config import ServeConfig
from arbiter.server.declared import load as load_declared

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp logs every access at INFO; kubernetes_asyncio is chatty at DEBUG.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get("ARBITER_" + name.upper().replace("-", "_"), default)


def _env_flag(name: str) -> bool:
    return (_env(name) or "").lower() in ("1", "true", "yes", "on")


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text[:40]!r} is not true or false")


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


class _DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to a flag's help, unless the help names its
    default itself or there is none (None, False, empty)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default in (None, False, [], "", argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


class Bounded:
    """An argparse type: a finite number of `kind`, at least `least` (above it when
    `above`; `least=None`: no lower bound) and at most `most`."""

    def __init__(self, kind: type[int] | type[float], least: float | None, above: bool,
                 most: float | None = None) -> None:
        self.kind, self.least, self.above, self.most = kind, least, above, most
        self.__name__ = kind.__name__  # argparse names the type in its errors

    def __call__(self, text: str) -> float:
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text[:40]!r} is not {'an integer' if self.kind is int else 'a number'}"
            ) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number")
        if self.least is not None and (value <= self.least if self.above
                                       else value < self.least):
            bound = "greater than" if self.above else "at least"
            raise argparse.ArgumentTypeError(f"{value} must be {bound} {self.least:g}")
        if self.most is not None and value > self.most:
            raise argparse.ArgumentTypeError(f"{value} must be at most {self.most:g}")
        return value


def add_parser(subparsers: Any) -> None:
    defaults = ServeConfig()
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the arbiter server (webhook, extender, admission loop)",
        description="Run the kube-arbiter server. Every flag defaults to the environment "
                    "variable ARBITER_<FLAG>, e.g. ARBITER_PORT.",
        formatter_class=_DefaultsFormatter,
    )
    add = parser.add_argument

    def number(flag: str, kind: type[int] | type[float], default: float, help: str,
               least: float | None = 0, above: bool = False,
               most: float | None = None) -> None:
        # The flag's default: its ARBITER_ variable when set and not empty, else the
        # ServeConfig default. A value outside its range stops the server at start
        # with the flag named: a zero timeout or cap would hold connections forever
        # or refuse all of them.
        convert = Bounded(kind, least, above, most)
        raw = _env(flag[2:])
        if raw:
            try:
                default = convert(raw)
            except argparse.ArgumentTypeError as error:
                variable = "ARBITER_" + flag[2:].upper().replace("-", "_")
                raise SystemExit(f"{variable}: {error}") from None
        add(flag, type=convert, default=default, help=help)

    add("--kubeconfig", default=_env("kubeconfig"),
        help="kubeconfig file (default: in-cluster config, else ~/.kube/config)")
    add("--host", default=_env("host", defaults.host), help="address to listen on")
    number("--port", int, defaults.port, most=65535,
           help="HTTPS port of the webhook (and of /healthz, /readyz, /metrics)")
    add("--cert-dir", type=Path, default=Path(_env("cert_dir", str(defaults.cert_dir)) or "."),
        help="directory with ca.crt/ca.key/tls.crt/tls.key; generated when empty; used as "
             "is (and reloaded on change) when it holds tls.crt/tls.key but no ca.key")
    add("--cert-secret", default=_env("cert_secret"),
        help="Secret in --namespace that stores the certificates (shared by replicas)")
    add("--webhook-url", default=_env("webhook_url"),
        help="https://HOST:PORT the apiserver reaches this server at; when set, arbiter "
             "installs and owns its webhook configurations with this URL and keeps their "
             "caBundle current")
    add("--namespace", default=_env("namespace", defaults.namespace),
        help="arbiter's own namespace (never managed; holds the Lease and Secret)")
    add("--service-name", default=_env("service_name", defaults.service_name),
        help="name of arbiter's Service and webhook configurations")
    add("--excluded-namespaces",
        default=_env("excluded_namespaces", ",".join(DEFAULT_EXCLUDED_NAMESPACES)),
        help="comma-separated namespaces arbiter never manages")
    add("--managed-namespaces", default=_env("managed_namespaces", defaults.managed_namespaces),
        choices=list(MANAGED_NAMESPACE_MODES),
        help="all: every namespace but the excluded ones and those labelled "
             "arbiter.dev/managed=false; listed: only namespaces a Queue admits "
             "(spec.namespaces, spec.namespaceSelector) or labelled arbiter.dev/managed=true; "
             "arbiter labels the admitted ones and its webhooks select on the label")
    add("--integrations", default=_env("integrations", "all"), metavar="LIST",
        help="workload integrations to switch on: comma-separated "
             f"{','.join(INTEGRATION_NAMES)}, or all, or none (Job and plain pods are "
             "always on); one whose CRD is not installed is reported once and waited for")
    add("--integration-file", default=_env("integration_file", ""), metavar="PATH",
        help="YAML or JSON file declaring custom resources to queue by their suspend "
             "field (docs/integrations.md, Declared integrations); refused with the "
             "field named: checked against each CRD at start (or when it appears)")
    number("--overcommit", float, defaults.overcommit, above=True,
        help="factor applied to cluster capacity")
    add("--no-leader-elect", action="store_true", default=_env_flag("no_leader_elect"),
        help="run the admission loop without a Lease (one replica only)")
    add("--identity", default=_env("identity", socket.gethostname()),
        help="this replica's leader-election identity (default: hostname)")
    add("--lease-name", default=_env("lease_name", defaults.lease_name),
        help="name of the leader-election Lease in --namespace")
    number("--reclaim-grace", float, defaults.reclaim_grace,
        help="seconds a queue below its deserved share waits before resources are "
             "reclaimed for it (short bursts do not thrash)")
    number("--reclaim-pdb-timeout", float, defaults.reclaim_pdb_timeout, least=None,
        help="seconds PodDisruptionBudgets may block taking a pod back for a starving "
             "queue; then the pod is deleted instead of evicted, with an Event (negative: "
             "never, and a PodDisruptionBudget can stop reclaim for good)")
    number("--admission-timeout", float, defaults.admission_timeout, above=True,
        help="seconds an admitted unit may take to start running before it is backed off "
             "and requeued (a Job: from its status.startTime, at most 3x from admission)")
    number("--status-interval", float, defaults.status_interval,
        help="minimum seconds between two status writes of one Queue or QueueUnit")
    number("--status-qps", float, defaults.status_qps, above=True,
        help="status writes per second, all objects together")
    add("--username", action="append", default=list(_csv(_env("username") or "")),
        help="username arbiter's requests carry, if SelfSubjectReview is unavailable "
             "(repeatable)")
    number("--max-body-bytes", int, defaults.max_body_bytes, above=True,
        help="largest AdmissionReview body accepted (larger: HTTP 400)")
    number("--extender-assume-ttl", float, defaults.extender_assume_ttl, above=True,
        help="seconds a pod the scheduler extender approved counts against its queue's "
             "capability before its binding is seen")
    number("--extender-port", int, defaults.extender_port, most=65535,
        help="HTTPS port of the scheduler extender (/scheduler/...), its own listener")
    add("--extender-client-ca", type=Path, default=_env("extender_client_ca"),
        help="CA file: the extender then requires a client certificate it signed "
             "(kube-scheduler's tlsConfig certFile/keyFile); without it any client may "
             "call the extender and a warning is logged at start")
    add("--extender-client-names",
        default=_env("extender_client_names", ",".join(defaults.extender_client_names)),
        help="with --extender-client-ca: comma-separated commonNames of the client "
             "certificates allowed to call the extender (the CA may sign others too); "
             "empty: any certificate that CA signed")
    number("--metrics-port", int, defaults.metrics_port, most=65535,
        help="HTTPS port of /metrics, /healthz, /readyz and the debug API")
    number("--listener-max-connections", int, defaults.listener_max_connections, above=True,
        help="open connections per listener (webhook, extender, metrics); at the cap a new "
             "connection closes the oldest one that has not sent a request yet")
    number("--listener-max-connections-per-source", int,
        defaults.listener_max_connections_per_source, above=True,
        help="open connections per listener from one client IP; past it that IP's new "
             "connections are refused")
    number("--listener-handshake-timeout", float, defaults.listener_handshake_timeout,
           above=True,
        help="seconds a client may take to finish the TLS handshake")
    number("--listener-header-timeout", float, defaults.listener_header_timeout, above=True,
        help="seconds from the handshake until the first request's head is complete")
    number("--listener-idle-timeout", float, defaults.listener_idle_timeout, above=True,
        help="seconds a keep-alive connection may sit between requests")
    number("--max-resource-names", int, defaults.max_resource_names, above=True,
        help="resources one pod, Job pod template or QueueUnit may request; more is denied")
    number("--max-units-per-namespace", int, defaults.max_units_per_namespace, above=True,
        help="QueueUnits a namespace may hold; past it new Jobs, pods and QueueUnits there "
             "are denied")
    add("--debug-api", default=_env("debug_api", defaults.debug_api),
        choices=["off", "loopback", "token"],
        help="the read-only /debug API on the metrics port: off; loopback (clients on "
             "this host only); token (a bearer token the apiserver accepts, for a user "
             "who may get Queues)")
    add("--web-view", default=_env("web_view", defaults.web_view),
        choices=["off", "loopback", "token"],
        help="the read-only web view at /view/ on the metrics port: off; loopback "
             "(clients on this host only); token (a token the apiserver accepts; each "
             "user sees the queues of the namespaces where it may list QueueUnits)")
    number("--extender-locality-weight", int, defaults.extender_locality_weight,
        help="prioritize: weight of gang locality (nodes running the unit's pods)")
    number("--extender-binpack-weight", int, defaults.extender_binpack_weight,
        help="prioritize: weight of bin-packing on the pod's dominant resource")
    add("--admit-on-create", type=_boolean, nargs="?", const=True,
        default=_boolean(_env("admit_on_create") or str(defaults.admit_on_create)),
        metavar="true|false",
        help="admission at creation: the leader's webhook lets a Job through admitted "
             "(never suspended) when its queue would admit it next (the default); =false "
             "holds every Job until the admission loop admits it")
    number("--test-fast-path-unit-delay", float, defaults.fast_path_unit_delay,
        help="tests only: seconds the loop waits before writing the unit of a Job admitted "
             "at creation (the e2e kill between the webhook's answer and that write)")
    add("--log-level", default=_env("log_level", "info"),
        choices=["debug", "info", "warning", "error", "DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level")
    parser.set_defaults(handler=run)


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    if args.managed_namespaces not in MANAGED_NAMESPACE_MODES:  # from the environment
        raise SystemExit(f"--managed-namespaces (ARBITER_MANAGED_NAMESPACES): "
                         f"{str(args.managed_namespaces)[:40]!r} must be all or listed")
    try:
        integrations = parse_integrations(args.integrations)
    except ValueError as error:
        raise SystemExit(f"--integrations (ARBITER_INTEGRATIONS): {error}") from None
    declared: tuple[Declaration, ...] = ()
    if args.integration_file:
        try:
            declared = load_declared(Path(args.integration_file))
        except DeclarationError as error:
            raise SystemExit(f"--integration-file {args.integration_file}: {error}") from None
    # Field by field, so mypy checks each name and type.
    return ServeConfig(
        integrations=integrations,
        declared=declared,
        host=args.host,
        port=args.port,
        cert_dir=args.cert_dir,
        webhook_url=args.webhook_url or None,
        service_name=args.service_name,
        namespace=args.namespace,
        kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
        excluded_namespaces=_csv(args.excluded_namespaces),
        managed_namespaces=args.managed_namespaces,
        overcommit=args.overcommit,
        leader_elect=not args.no_leader_elect,
        identity=args.identity,
        lease_name=args.lease_name,
        reclaim_grace=args.reclaim_grace,
        reclaim_pdb_timeout=args.reclaim_pdb_timeout,
        admission_timeout=args.admission_timeout,
        status_interval=args.status_interval,
        status_qps=args.status_qps,
        cert_secret=args.cert_secret or None,
        usernames=tuple(args.username),
        max_body_bytes=args.max_body_bytes,
        extender_assume_ttl=args.extender_assume_ttl,
        extender_port=args.extender_port,
        metrics_port=args.metrics_port,
        debug_api=args.debug_api,
        web_view=args.web_view,
        listener_max_connections=args.listener_max_connections,
        listener_max_connections_per_source=args.listener_max_connections_per_source,
        listener_handshake_timeout=args.listener_handshake_timeout,
        listener_header_timeout=args.listener_header_timeout,
        listener_idle_timeout=args.listener_idle_timeout,
        max_resource_names=args.max_resource_names,
        max_units_per_namespace=args.max_units_per_namespace,
        admit_on_create=args.admit_on_create,
        fast_path_unit_delay=args.test_fast_path_unit_delay,
        extender_client_ca=Path(args.extender_client_ca) if args.extender_client_ca else None,
        extender_client_names=_csv(args.extender_client_names or ""),
        extender_locality_weight=args.extender_locality_weight,
        extender_binpack_weight=args.extender_binpack_weight,
        log_level=args.log_level.upper(),
    )


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    setup_logging(config.log_level)
    from arbiter.server.app import serve

    loop_factory = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(config))
    return 0
