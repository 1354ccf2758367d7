"""What every surface and background task of the server shares: the
`ServerContext`, the health and metrics routes, supervision of background
tasks, and the process plumbing (API client, identity, certificate names).

Which surfaces and tasks run is decided in one place, `arbiter.server.app`; this
module registers nothing.
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio import config as kube_config
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from arbiter.base import metrics
from arbiter.base.kubeapi import ApiError, self_usernames
from arbiter.base.metrics import REGISTRY
from arbiter.cache.changes import ChangeWaiter
from arbiter.cache.store import KINDS, ClusterStore
from arbiter.cache.watch import RESOURCES, run_watchers, workload_resources
from arbiter.loop.runtime import Leadership
from arbiter.server.config import ServeConfig
from certs.manager import CertManager
from certs.publish import publish_ca_bundle
from webhook.configuration import desired_configurations, install, service_account_username
from webhook.review import AdmissionEnv

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ServerContext:
    config: ServeConfig
    store: ClusterStore
    # kubernetes_asyncio ApiClient; None when running without a cluster (tests).
    api: Any | None = None
    # A second ApiClient (its own connection pool) for the leader Lease; None:
    # the Lease goes through `api`.
    lease_api: Any | None = None
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
    # The admission controller while this replica leads (the debug API reads it).
    leadership: Leadership = field(default_factory=Leadership)
    # The key of fast-path tokens (DESIGN §16), from the certificates every
    # replica shares; None: admission at creation is off.
    fast_path_key: bytes | None = None
    # Wakes webhook decisions waiting for this replica's watch (a listener
    # of the store while the webhook is served: `server.app.build_app`).
    changes: ChangeWaiter = field(default_factory=ChangeWaiter)

    @property
    def admission_env(self) -> AdmissionEnv:
        return AdmissionEnv(store=self.store, own_usernames=self.own_usernames,
                            changes=self.changes,
                            max_resource_names=self.config.max_resource_names,
                            max_units_per_namespace=self.config.max_units_per_namespace,
                            admit_on_create=self._admit_on_create
                            if self.fast_path_key is not None else None,
                            fast_path_key=self.fast_path_key)

    def _admit_on_create(self, namespace: str, name: str, queue: str,
                         obj: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The webhook's fast path goes to the admission controller while
        this replica leads; a replica that does not lead holds every Job."""
        controller = self.leadership.controller
        if controller is None:
            return None
        return controller.admit_on_create(namespace, name, queue, obj)

    def ready(self) -> bool:
        installs = bool(self.config.webhook_url) and self.api is not None
        return (self.store.synced and not self.stopping.is_set()
                and (self.webhooks_installed or not installs)
                and all(check() for check in self.ready_checks))


CONTEXT: web.AppKey[ServerContext] = web.AppKey("arbiter_context", ServerContext)

# A background task with its dependencies bound (kopf's root tasks).
Task = Callable[[], Awaitable[None]]


# -- routes at the root (health and metrics) ------------------------------------------
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


def add_metrics_route(app: web.Application) -> None:
    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(REGISTRY)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app.router.add_get("/metrics", metrics)


# -- background tasks (started by arbiter.server.app) ---------------------------------------
async def watch_cluster(ctx: ServerContext) -> None:
    if ctx.api is None:
        return
    await run_watchers(ctx.api, ctx.store, (*RESOURCES, *workload_resources(ctx.store)))


async def _publish_ca(ctx: ServerContext, ca_pem: bytes) -> None:
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
    for _ in range(300):
        if ctx.store.synced:
            break
        await asyncio.sleep(0.1)
    ca_bundle = ctx.certs.ca_pem if ctx.certs is not None and ctx.certs.ca_pem else None
    mutating, validating = desired_configurations(
        url=ctx.config.webhook_url, ca_bundle=ca_bundle,
        excluded_namespaces=excluded_namespaces(ctx.config),
        name=ctx.config.service_name,
        own_usernames=ctx.own_usernames,
        managed=ctx.config.managed_namespaces,
    )
    await install(ctx.api, mutating, validating)
    ctx.webhooks_installed = True


# Whether `freeze_after_first_sync` has frozen this process's heap already.
_heap_frozen = False


async def sample_loop_lag(interval: float = 0.1) -> None:
    """Observe, ten times a second, how late a timer fires: the handlers'
    own durations cannot show the time a request waits for the loop (the
    chaos run saw 0.7 s webhook calls with 1-17 ms handlers)."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(interval)
        metrics.event_loop_lag_seconds.observe(max(0.0, loop.time() - asked - interval))


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


# First delay before a failed background task is restarted (doubles, max 60 s).
RESTART_BACKOFF = 1.0


async def supervise(name: str, task: Task) -> None:
    """Run `task` until it returns; after an exception, log it and run it
    again with backoff (doubling up to 60 s)."""
    backoff = RESTART_BACKOFF
    while True:
        try:
            await task()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task failed; restarting",
                          extra={"task": name, "retry_in": backoff})
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 60.0)


def run_while_serving(app: web.Application, tasks: Mapping[str, Task]) -> None:
    """Start every task (supervised, by name) when `app` starts; cancel
    them when it stops."""
    async def running(_: web.Application) -> AsyncIterator[None]:
        started = [asyncio.create_task(supervise(name, task), name=name)
                   for name, task in tasks.items()]
        yield
        for item in started:
            item.cancel()
        await asyncio.gather(*started, return_exceptions=True)

    app.cleanup_ctx.append(running)


# -- process ------------------------------------------------------------------------------------
def serving_names(config: ServeConfig) -> tuple[list[str], list[str]]:
    """DNS names and IPs the serving certificate must cover."""
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


async def api_client(config: ServeConfig) -> Any:
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
    return client_for(configuration)


def client_for(configuration: Any) -> Any:
    """An ApiClient (a connection pool of its own) for a loaded configuration."""
    api = client.ApiClient(configuration)
    if not any(os.environ.get(name) for name in PROXY_VARIABLES):
        # kubernetes_asyncio's session trusts the environment, so aiohttp
        # looks up proxies and ~/.netrc in a worker thread for *every*
        # request: two thread hops per API call, measured at ~8 % of the
        # process's CPU under load and a wait on a busy event loop. Decided
        # once here instead (a proxy set in the environment still applies).
        api.rest_client.pool_manager._trust_env = False
    return api


# Environment variables that make aiohttp route requests through a proxy.
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                   "ALL_PROXY", "all_proxy", "NETRC")


async def learn_usernames(ctx: ServerContext) -> None:
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
            service_account_username(ctx.config.namespace, ctx.config.service_name))
    log.info("own identity", extra={"usernames": sorted(ctx.own_usernames)})

