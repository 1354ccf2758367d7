"""The composition root: everything `arbiter serve` runs, named in one place.

    build_app(ctx)                  the aiohttp application on --port
      /healthz /readyz /metrics     health and metrics (root routes)
      /webhook/...                  admission reviews   (webhook.http.webhook_app)
    build_metrics_app(ctx)          the application on --metrics-port
      /healthz /readyz /metrics     health and metrics
      /debug/...                    read-only queue API (arbiter.server.debug.debug_app),
                                    only with --debug-api loopback|token
      /view/...                     read-only web view (arbiter.server.web.app.web_app),
                                    only with --web-view loopback|token
    build_extender_app(ctx)         the application on --extender-port, its own
                                    listener: only kube-scheduler calls it, with a
                                    client certificate of --extender-client-ca
      /healthz /readyz              health
      /scheduler/...                scheduler extender  (extender.routes.extender_app)
    start_listeners(ctx, tls)       all three, each on its own TLS listener
    background_tasks(ctx, leadership)   run while the app runs; restarted after a failure
    leader_tasks(ctx)                   run beside the admission controller while this
                                        replica leads; cancelled when it stops

Every dependency is passed by keyword, so reading this module tells what
runs and what it is given; a component that is missing is an import error.
Each surface is its own sub-application with its own startup and cleanup,
so it is served on the listener its callers need (DESIGN §13) without
changing the surface itself.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from functools import partial
from typing import Any

from aiohttp import web

from arbiter.base.httpserve import HANDLER_ARGS, GuardedSite, ListenerLimits
from arbiter.base.kubeapi import KubeApi
from arbiter.cache.store import ClusterStore
from arbiter.core.fastpath import derive_key
from arbiter.integrations import enabled as enabled_integrations
from arbiter.integrations.declared import DeclarationError
from arbiter.integrations.declared import build as build_declared
from arbiter.jobflow.controller import run_leader as run_jobflow_controller
from arbiter.loop import namespaces as managed_namespaces
from arbiter.loop.leader import LeaseTiming
from arbiter.loop.runtime import Election, Leadership, LeaderTask, run_admission
from arbiter.loop.settings import LoopSettings
from arbiter.server import debug, declared
from arbiter.server.config import ServeConfig
from arbiter.server.context import (
    CONTEXT,
    ServerContext,
    Task,
    add_health_routes,
    add_metrics_route,
    api_client,
    client_for,
    excluded_namespaces,
    freeze_after_first_sync,
    install_webhook_configurations,
    learn_usernames,
    maintain_certificates,
    run_while_serving,
    sample_loop_lag,
    serving_names,
    watch_cluster,
)
from arbiter.server.web import access as web_access
from arbiter.server.web import app as web_routes
from certs.manager import CertManager
from certs.reload import ReloadingTLS
from extender import routes as extender_routes
from extender.state import ExtenderState
from webhook import http as webhook_http

log = logging.getLogger(__name__)


def build_app(ctx: ServerContext, *, background: bool = True) -> web.Application:
    """Every surface, and (unless `background` is False) every background
    task tied to the application's life."""
    config = ctx.config
    leadership = ctx.leadership
    app = web.Application(client_max_size=max(config.max_body_bytes,
                                              config.extender_max_body_bytes),
                          handler_args=HANDLER_ARGS)
    app[CONTEXT] = ctx
    add_health_routes(app, ctx)
    add_metrics_route(app)
    ctx.store.listeners.append(ctx.changes.on_change)
    app.add_subapp(webhook_http.PREFIX, webhook_http.webhook_app(
        env=ctx.admission_env, max_body=config.max_body_bytes))
    if background:
        run_while_serving(app, background_tasks(ctx, leadership))
    return app


def build_extender_app(ctx: ServerContext) -> web.Application:
    """The scheduler extender and health, for the extender's own listener."""
    config = ctx.config
    app = web.Application(client_max_size=config.extender_max_body_bytes,
                          handler_args=HANDLER_ARGS)
    app[CONTEXT] = ctx
    add_health_routes(app, ctx)
    app.add_subapp(extender_routes.PREFIX, extender_routes.extender_app(
        extender_state(ctx.store, config, ctx.fast_path_key),
        max_body=config.extender_max_body_bytes,
        # Names are checked only where a CA verified the certificate.
        client_names=frozenset(config.extender_client_names)
        if config.extender_client_ca is not None else frozenset()))
    return app


def build_metrics_app(ctx: ServerContext) -> web.Application:
    """Health, metrics and (when enabled) the debug API and the web view,
    for the metrics listener."""
    config = ctx.config
    app = web.Application(handler_args=HANDLER_ARGS)
    app[CONTEXT] = ctx
    add_health_routes(app, ctx)
    add_metrics_route(app)
    access = surface_access("--debug-api", config.debug_api)
    if access != "off":
        check = debug.TokenReviewer(ctx.api) if access == "token" and ctx.api is not None \
            else None
        app.add_subapp(debug.PREFIX, debug.debug_app(
            store=ctx.store, overcommit=config.overcommit, leadership=ctx.leadership,
            access=access, check_token=check))
    view = surface_access("--web-view", config.web_view)
    if view != "off":
        reviewer = web_access.ViewerReviewer(ctx.api) \
            if view == "token" and ctx.api is not None else None
        app.router.add_get(web_routes.PREFIX, web_routes.to_root)
        app.add_subapp(web_routes.PREFIX, web_routes.web_app(
            store=ctx.store, overcommit=config.overcommit, leadership=ctx.leadership,
            access_mode=view, reviewer=reviewer,
            api=KubeApi(ctx.api) if ctx.api is not None else None))
    return app


def surface_access(flag: str, value: str) -> debug.DebugAccess:
    """Who may call a surface of the metrics listener, from its flag."""
    if value == "off":
        return "off"
    if value == "loopback":
        return "loopback"
    if value == "token":
        return "token"
    raise ValueError(f"{flag} must be off, loopback or token, not {value!r}")


def extender_tls(ctx: ServerContext, tls: ReloadingTLS) -> ssl.SSLContext:
    """The extender's TLS: client certificates of --extender-client-ca
    required, or (without the flag) anyone served, with a warning."""
    client_ca = ctx.config.extender_client_ca
    if client_ca is None:
        log.warning("the scheduler extender accepts calls from any client: its answers "
                    "change shared state (assumed pods), so set --extender-client-ca to "
                    "the CA of kube-scheduler's client certificate")
        return tls.context
    return tls.requiring_clients_of(client_ca)


async def start_listeners(ctx: ServerContext, tls: ReloadingTLS, *,
                          background: bool = True) -> dict[str, web.AppRunner]:
    """Every listener, started: name -> its runner (cleanup stops it)."""
    config = ctx.config
    listeners = {
        "webhook": (build_app(ctx, background=background), config.port, tls.context),
        "extender": (build_extender_app(ctx), config.extender_port, extender_tls(ctx, tls)),
        "metrics": (build_metrics_app(ctx), config.metrics_port, tls.context),
    }
    limits = listener_limits(config)
    runners: dict[str, web.AppRunner] = {}
    try:
        for name, (application, port, context) in listeners.items():
            runner = web.AppRunner(application, access_log=None, shutdown_timeout=20.0,
                                   keepalive_timeout=limits.idle_timeout)
            await runner.setup()
            runners[name] = runner
            site = GuardedSite(runner, config.host, port, tls=context, limits=limits, name=name)
            await site.start()
            log.info("serving", extra={"listener": name, "host": config.host,
                                       "port": runner.addresses[0][1]})
    except BaseException:
        for runner in runners.values():
            await runner.cleanup()
        raise
    return runners


def listener_limits(config: ServeConfig) -> ListenerLimits:
    return ListenerLimits(
        max_connections=config.listener_max_connections,
        max_connections_per_source=config.listener_max_connections_per_source,
        handshake_timeout=config.listener_handshake_timeout,
        header_timeout=config.listener_header_timeout,
        idle_timeout=config.listener_idle_timeout,
    )


def background_tasks(ctx: ServerContext, leadership: Leadership) -> dict[str, Task]:
    """Every task that runs beside the request handlers, by name."""
    config = ctx.config
    return {
        "cluster-watch": partial(watch_cluster, ctx),
        "certificates": partial(maintain_certificates, ctx),
        "webhook-configurations": partial(install_webhook_configurations, ctx),
        "heap-freeze": partial(freeze_after_first_sync, ctx),
        "loop-lag": sample_loop_lag,
        # Declared kinds whose CRD was missing at startup: checked when it appears.
        "declared-crds": partial(declared.run_waiting, ctx.api, ctx.store),
        # Leader election, and while leading the admission loop and leader_tasks.
        "admission": partial(
            run_admission, api=ctx.api, lease_api=ctx.lease_api, store=ctx.store,
            settings=loop_settings(config),
            election=election(config), replica=config.identity,
            event_qps=config.event_qps, leadership=leadership, leader_tasks=leader_tasks(ctx),
            fast_path_key=ctx.fast_path_key),
    }


def leader_tasks(ctx: ServerContext) -> dict[str, LeaderTask]:
    """Leader-only work besides the admission controller, by name."""
    return {
        "jobflow-controller": partial(run_jobflow_controller, api=ctx.api, store=ctx.store),
        # --managed-namespaces listed: the managed label on admitted namespaces.
        "managed-namespace-labels": partial(managed_namespaces.run_leader, api=ctx.api,
                                            store=ctx.store),
    }


def loop_settings(config: ServeConfig) -> LoopSettings:
    # Field by field, so mypy checks each name and type.
    return LoopSettings(
        overcommit=config.overcommit,
        admission_timeout=config.admission_timeout,
        backoff_base=config.backoff_base,
        backoff_max=config.backoff_max,
        status_interval=config.status_interval,
        status_qps=config.status_qps,
        max_writes=config.loop_concurrency,
        reclaim_grace=config.reclaim_grace,
        reclaim_pdb_timeout=config.reclaim_pdb_timeout,
        admit_on_create=config.admit_on_create,
        fast_unit_delay=config.fast_path_unit_delay,
    )


def election(config: ServeConfig) -> Election | None:
    if not config.leader_elect:
        return None
    timing = LeaseTiming(config.lease_duration, config.lease_renew_deadline,
                         config.lease_retry_period)
    return Election(config.namespace, config.lease_name, timing)


def extender_state(store: ClusterStore, config: ServeConfig,
                   fast_path_key: bytes | None = None) -> ExtenderState:
    return ExtenderState(
        store,
        fast_path_key=fast_path_key,
        assume_ttl=config.extender_assume_ttl,
        overcommit=config.overcommit,
        locality_weight=config.extender_locality_weight,
        binpack_weight=config.extender_binpack_weight,
    )


async def serve(config: ServeConfig, *, api: Any | None = None,
                install_signals: bool = True) -> None:
    """Run the server until SIGTERM/SIGINT (or ctx.stopping), then stop gracefully."""
    declared_kinds = build_declared(config.declared)
    declared.register(declared_kinds)  # before the store: its tables list them
    store = ClusterStore(excluded_namespaces=frozenset(excluded_namespaces(config)),
                         managed_mode=config.managed_namespaces,
                         integrations=enabled_integrations(config.integrations))
    owns_api = api is None
    lease_api = None
    if api is None:
        api = await api_client(config)
    try:
        missing = await declared.check_installed(api, declared_kinds, store)
    except DeclarationError as error:
        if owns_api:
            await api.close()
        raise SystemExit(f"--integration-file: {error}") from None
    store.integrations = (*store.integrations,
                          *(i for i in declared_kinds if i not in missing))
    if api is not None and owns_api:
        # The Lease is renewed through a client of its own: on the shared one
        # a burst of status writes and watches can fill the connection pool
        # for longer than the renew deadline, and the leader lets go.
        lease_api = client_for(api.configuration)
    dns, ips = serving_names(config)
    secret = (config.namespace, config.cert_secret) if config.cert_secret else None
    certs = CertManager(config.cert_dir, dns, ips, api=api, secret=secret)
    ctx = ServerContext(config=config, store=store, api=api, certs=certs, lease_api=lease_api)
    try:
        await learn_usernames(ctx)
        tls = await certs.prepare()
        shared = certs.shared_secret() if config.admit_on_create else None
        ctx.fast_path_key = derive_key(shared) if shared is not None else None
        if config.admit_on_create and shared is None:
            log.warning("admission at creation is off: no certificate key to sign its "
                        "tokens with")
        if certs.external:
            log.info("using certificates provided from outside",
                     extra={"dir": str(config.cert_dir)})
        if install_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, ctx.stopping.set)
        runners = await start_listeners(ctx, tls)
        await ctx.stopping.wait()
        log.info("shutting down")
        for runner in runners.values():
            await runner.cleanup()
    finally:
        if owns_api:
            await api.close()
        if lease_api is not None:
            await lease_api.close()
