"""The one asyncio server: webhook, health, metrics, and whatever other
components register, plus their background tasks.

Extension points (append to the tuples; entries are callables or
"module:function" strings resolved when the app is built, so a module that
imports `ServerContext` from here can be registered without an import
cycle):

- `ROUTE_PROVIDERS`: `(app: web.Application, ctx: ServerContext) -> None`,
  called once by `build_app` to add routes (e.g. the extender's
  `/scheduler/...`, the debug API).
- `BACKGROUND_TASKS`: `async (ctx: ServerContext) -> None`, started when
  the app starts and cancelled when it stops (e.g. the admission loop).
  A task that raises is logged and restarted with backoff; one that
  returns is done.

Everything request handlers need lives in the `ServerContext`, reachable
from a request as `request.app[CONTEXT]`.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from arbiter.cache.store import KINDS, ClusterStore
from arbiter.config import ServeConfig
from arbiter.metrics import REGISTRY
from certs.manager import CertManager
from webhook.review import AdmissionEnv

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ServerContext:
    config: ServeConfig
    store: ClusterStore
    # kubernetes_asyncio ApiClient; None when running without a cluster (tests).
    api: Any | None = None
    # Usernames arbiter's own API requests carry (SelfSubjectReview at
    # startup, else config.usernames); the webhook lets them do what only
    # arbiter may do (lift a gate, unsuspend a Job).
    own_usernames: set[str] = field(default_factory=set)
    certs: CertManager | None = None
    # Set to begin a graceful shutdown.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # Extra readiness conditions other components may add (all must hold).
    ready_checks: list[Callable[[], bool]] = field(default_factory=list)
    # With --webhook-url: set once arbiter's webhook configurations exist.
    webhooks_installed: bool = False

    @property
    def admission_env(self) -> AdmissionEnv:
        return AdmissionEnv(store=self.store, own_usernames=self.own_usernames)

    def ready(self) -> bool:
        installs = bool(self.config.webhook_url) and self.api is not None
        return (self.store.synced and not self.stopping.is_set()
                and (self.webhooks_installed or not installs)
                and all(check() for check in self.ready_checks))


CONTEXT: web.AppKey[ServerContext] = web.AppKey("arbiter_context", ServerContext)

RouteProvider = Callable[[web.Application, ServerContext], None]
BackgroundTask = Callable[[ServerContext], Awaitable[None]]


# -- built-in routes ------------------------------------------------------------
def add_health_routes(app: web.Application, ctx: ServerContext) -> None:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if ctx.ready():
            return web.Response(text="ok\n")
        missing = sorted(set(KINDS) - ctx.store.synced_kinds)
        if ctx.stopping.is_set():
            reason = "stopping"
        elif missing:
            reason = f"cache not synced: {', '.join(missing)}"
        elif ctx.config.webhook_url and not ctx.webhooks_installed:
            reason = "webhook configurations not installed yet"
        else:
            reason = "not ready"
        return web.Response(status=503, text=reason + "\n")

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def add_metrics_route(app: web.Application, ctx: ServerContext) -> None:
    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(REGISTRY)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app.router.add_get("/metrics", metrics)


def add_webhook_routes(app: web.Application, ctx: ServerContext) -> None:
    from webhook.http import add_routes

    add_routes(app, ctx.admission_env, ctx.config.max_body_bytes)


# -- built-in background tasks ------------------------------------------------------
async def watch_cluster(ctx: ServerContext) -> None:
    if ctx.api is None:
        return
    from arbiter.cache.watch import run_watchers

    await run_watchers(ctx.api, ctx.store)


async def _publish_ca(ctx: ServerContext, ca_pem: bytes) -> None:
    from certs.publish import publish_ca_bundle

    if ctx.api is not None:
        await publish_ca_bundle(ctx.api, ca_pem, ctx.config.service_name)


async def maintain_certificates(ctx: ServerContext) -> None:
    """Renew / reload the serving certificate; republish the caBundle on change."""
    if ctx.certs is None:
        return

    async def on_ca_change(ca_pem: bytes) -> None:
        await _publish_ca(ctx, ca_pem)

    if not ctx.config.webhook_url and ctx.certs.ca_pem:
        # Configurations installed from manifests/webhooks.yaml carry no
        # caBundle: publish ours once at startup (install does it otherwise).
        await on_ca_change(ctx.certs.ca_pem)
    await ctx.certs.run(ctx.config.cert_check_interval, on_ca_change)


async def install_webhook_configurations(ctx: ServerContext) -> None:
    """With --webhook-url: create/update arbiter's webhook configurations.

    Waits (up to 30 s) for the first cache sync, so that the apiserver does
    not call a webhook that can only answer "starting".
    """
    if ctx.api is None or not ctx.config.webhook_url:
        return
    from webhook.configuration import desired_configurations, install

    for _ in range(300):
        if ctx.store.synced:
            break
        await asyncio.sleep(0.1)
    ca_bundle = ctx.certs.ca_pem if ctx.certs is not None and ctx.certs.ca_pem else None
    mutating, validating = desired_configurations(
        url=ctx.config.webhook_url, ca_bundle=ca_bundle,
        excluded_namespaces=excluded_namespaces(ctx.config),
        name=ctx.config.service_name,
    )
    await install(ctx.api, mutating, validating)
    ctx.webhooks_installed = True


# Whether `freeze_after_first_sync` has frozen this process's heap already.
_heap_frozen = False


async def freeze_after_first_sync(ctx: ServerContext, poll: float = 0.1) -> None:
    """Once the cache has listed everything the first time, freeze the heap.

    The cache then holds most objects this process will ever keep (100k pod
    records and their Resources at scale), and they live until the process
    ends. CPython's cyclic GC walks every tracked object on each full
    collection: with 100k cached objects a full collection was measured to
    pause the event loop for 100+ ms, stalling webhook and extender requests
    as long. `gc.freeze()` moves everything alive now to
    a permanent generation the collector skips; `gc.collect()` first, so no
    garbage is frozen with it. Objects created later are collected as usual.
    Once per process (tests run several servers in one).
    """
    global _heap_frozen
    # The store has no "synced" event (tests and relists set synced_kinds
    # directly); a 10 Hz check until the first sync costs nothing.
    while not ctx.store.synced:  # noqa: ASYNC110
        await asyncio.sleep(poll)
    if _heap_frozen:
        return
    _heap_frozen = True
    gc.collect()
    gc.freeze()
    log.info("heap frozen after the first cache sync",
             extra={"frozen_objects": gc.get_freeze_count()})


def excluded_namespaces(config: ServeConfig) -> tuple[str, ...]:
    """The configured exclusions plus arbiter's own namespace, always."""
    return tuple(sorted({*config.excluded_namespaces, config.namespace}))


ROUTE_PROVIDERS: tuple[RouteProvider | str, ...] = (
    add_health_routes,
    add_metrics_route,
    add_webhook_routes,
    "extender.routes:add_routes",  # POST /scheduler/{filter,prioritize,preempt}
    "arbiter.debug:add_routes",  # GET /debug/queues, /debug/queues/{name}/pending
)
BACKGROUND_TASKS: tuple[BackgroundTask | str, ...] = (
    watch_cluster,
    maintain_certificates,
    install_webhook_configurations,
    freeze_after_first_sync,
    "arbiter.loop.runtime:run_admission",  # leader election + the admission loop
)


def _resolve(entry: Callable[..., Any] | str) -> Callable[..., Any] | None:
    if not isinstance(entry, str):
        return entry
    module_name, _, attribute = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            log.debug("extension not present", extra={"entry": entry})
            return None  # a component not in this build (yet)
        raise
    return cast(Callable[..., Any], getattr(module, attribute))


# First delay before a failed background task is restarted (doubles, max 60 s).
RESTART_BACKOFF = 1.0


async def _supervise(ctx: ServerContext, task: BackgroundTask, name: str) -> None:
    backoff = RESTART_BACKOFF
    while True:
        try:
            await task(ctx)
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task failed; restarting",
                          extra={"task": name, "retry_in": backoff})
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 60.0)


def build_app(ctx: ServerContext, *, background: bool = True) -> web.Application:
    """The aiohttp application: every route provider, and (unless
    `background` is False) every background task tied to its life."""
    limit = max(ctx.config.max_body_bytes, ctx.config.extender_max_body_bytes)
    app = web.Application(client_max_size=limit)
    app[CONTEXT] = ctx
    for entry in ROUTE_PROVIDERS:
        provider = _resolve(entry)
        if provider is not None:
            provider(app, ctx)
    if background:
        tasks = [(str(entry), _resolve(entry)) for entry in BACKGROUND_TASKS]

        async def run_background(app: web.Application) -> AsyncIterator[None]:
            running = [
                asyncio.create_task(_supervise(ctx, task, name), name=name)
                for name, task in tasks if task is not None
            ]
            yield
            for item in running:
                item.cancel()
            await asyncio.gather(*running, return_exceptions=True)

        app.cleanup_ctx.append(run_background)
    return app


# -- process ------------------------------------------------------------------------------------
def serving_names(config: ServeConfig) -> tuple[list[str], list[str]]:
    """DNS names and IPs the serving certificate must cover."""
    import ipaddress

    service, namespace = config.service_name, config.namespace
    dns = [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local",
           f"{service}.{namespace}", service, "localhost"]
    ips = ["127.0.0.1"]
    if config.webhook_url:
        host = urlsplit(config.webhook_url).hostname or ""
        try:
            ips.append(str(ipaddress.ip_address(host)))
        except ValueError:
            if host:
                dns.append(host)
    return list(dict.fromkeys(dns)), list(dict.fromkeys(ips))


async def _api_client(config: ServeConfig) -> Any:
    from kubernetes_asyncio import client
    from kubernetes_asyncio import config as kube_config

    configuration = client.Configuration()
    if config.kubeconfig is not None:
        await kube_config.load_kube_config(config_file=str(config.kubeconfig),
                                           client_configuration=configuration)
    else:
        try:
            kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
        except kube_config.ConfigException:
            await kube_config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


async def learn_usernames(ctx: ServerContext) -> None:
    from arbiter.kubeapi import ApiError, self_usernames

    ctx.own_usernames.update(ctx.config.usernames)
    if ctx.api is None:
        return
    try:
        ctx.own_usernames.update(await self_usernames(ctx.api))
    except (ApiError, OSError) as error:
        log.warning("SelfSubjectReview failed; using configured usernames",
                    extra={"error": str(error)})
    if not ctx.own_usernames:
        ctx.own_usernames.add(
            f"system:serviceaccount:{ctx.config.namespace}:{ctx.config.service_name}")
    log.info("own identity", extra={"usernames": sorted(ctx.own_usernames)})


async def serve(config: ServeConfig, *, api: Any | None = None,
                install_signals: bool = True) -> None:
    """Run the server until SIGTERM/SIGINT (or ctx.stopping), then stop gracefully."""
    store = ClusterStore(excluded_namespaces=frozenset(excluded_namespaces(config)))
    owns_api = api is None
    if api is None:
        api = await _api_client(config)
    dns, ips = serving_names(config)
    secret = (config.namespace, config.cert_secret) if config.cert_secret else None
    certs = CertManager(config.cert_dir, dns, ips, api=api, secret=secret)
    ctx = ServerContext(config=config, store=store, api=api, certs=certs)
    try:
        await learn_usernames(ctx)
        tls = await certs.prepare()
        if certs.external:
            log.info("using certificates provided from outside",
                     extra={"dir": str(config.cert_dir)})
        if install_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, ctx.stopping.set)
        runner = web.AppRunner(build_app(ctx), access_log=None, shutdown_timeout=20.0)
        await runner.setup()
        site = web.TCPSite(runner, config.host, config.port, ssl_context=tls.context,
                           backlog=1024)
        await site.start()
        log.info("serving", extra={"host": config.host, "port": config.port})
        await ctx.stopping.wait()
        log.info("shutting down")
        await runner.cleanup()
    finally:
        if owns_api:
            await api.close()
