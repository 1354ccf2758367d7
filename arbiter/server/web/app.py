"""The web view's routes, a sub-application mounted at `PREFIX`:

    GET /view/                 the queues page
    GET /view/queues/{name}    one queue: its waiting units and why, its admitted units,
                               its share over the last hour
    GET /view/units/{namespace}/{name}
                               one unit: its timeline, pod sets and plan (unit.py)
    GET /view/pools            pools and a grid of nodes by use (cluster.py)
    GET /view/decisions[?queue=Q&limit=N]
                               the loop's last decisions (cluster.py)
    GET /view/events           server-sent events: counts as they change (live.py)
    GET /view/static/...       view.js, view.css

Every page reads the engine the debug API reads (`debug.current_mirror`:
the leader's own, or a kept view on another replica), so the view, the
debug API, Queue status and `arbiter queues` agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from html import escape
from pathlib import Path

from aiohttp import web

from arbiter.base.kubeapi import ClusterApi, unit_path
from arbiter.cache import convert
from arbiter.cache.store import ClusterStore
from arbiter.core.engine.flat import dominant_share_of
from arbiter.loop import decisions
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.pool_status import PoolView, pool_views
from arbiter.loop.runtime import Leadership
from arbiter.loop.status import QueueView, queue_views
from arbiter.server import debug
from arbiter.server.web import access, cluster, history, live, pages, unit

log = logging.getLogger(__name__)

PREFIX = "/view"
ROOT = PREFIX + "/"
STATIC = Path(__file__).parent / "static"
ASSETS = {"view.js": "text/javascript", "view.css": "text/css"}
# Seconds a unit page waits for the apiserver's copy of the QueueUnit.
READ_TIMEOUT = 2.0
# The application's share history (for benchmarks and tests to look at).
SHARES = web.AppKey("shares", history.ShareHistory)


def _html(text: str, status: int = 200) -> web.Response:
    response = web.Response(text=text, status=status, content_type="text/html")
    # A thousand queues are 400 KiB of HTML, 30 on the wire (compressed in
    # a thread past 4 KiB: aiohttp's zlib_executor_size).
    response.enable_compression()
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self'; form-action 'none'; frame-ancestors 'none'")
    return response


async def to_root(_: web.Request) -> web.StreamResponse:
    """`/view` without its slash (mounted on the parent application)."""
    raise web.HTTPFound(ROOT)


@web.middleware
async def sign_in(request: web.Request,
                  handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    """A page asked for without a token: the sign-in form, still a 401."""
    response = await handler(request)
    if response.status == 401 and "text/html" in request.headers.get("Accept", ""):
        return _html(pages.login_page(ROOT), 401)
    return response


def web_app(*, store: ClusterStore, overcommit: float, leadership: Leadership,
            access_mode: debug.DebugAccess = "loopback",
            reviewer: access.ViewerReviewer | None = None, api: ClusterApi | None = None,
            clock: Callable[[], float] = time.time,
            sample_every: float = history.STEP) -> web.Application:
    """The sub-application mounted at `PREFIX` (`reviewer`: with `token`;
    `api`: where a unit page reads its QueueUnit's status)."""
    view = debug.KeptView(store, overcommit, clock)
    check = reviewer if access_mode == "token" else None

    async def mirror() -> EngineMirror:
        return (await debug.current_mirror(view, leadership))[0]

    pulse = live.Pulse(store, mirror)
    table = pages.QueuesPage()
    shares = history.ShareHistory(sample_every)

    def published() -> Mapping[str, QueueView] | None:
        """The views the leader's loop last published (None elsewhere)."""
        controller = leadership.controller
        return controller.publisher.views if controller is not None else None

    def published_pools(engine: EngineMirror) -> Mapping[str, PoolView]:
        controller = leadership.controller
        if controller is not None and controller.publisher.pool_views:
            return controller.publisher.pool_views
        return pool_views(engine)

    async def to_sample() -> EngineMirror | None:
        """The engine to sample, when there is one without building it."""
        if leadership.controller is None and not view.following:
            return None
        return await mirror()

    async def seen(request: web.Request) -> access.Visibility:
        return await access.visibility(request, store, check)

    async def queues(request: web.Request) -> web.Response:
        visible = await seen(request)
        return _html(table.render(ROOT, await mirror(), visible, published(),
                                  shares.sparkline))

    async def queue(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        visible = await seen(request)
        engine = await mirror()
        if not visible.queue(name) or name not in engine.queues:
            # The same answer for a queue hidden and one that does not exist.
            return _html(f"no queue {escape(name[:253])!r}", 404)
        view = (published() or {}).get(name)
        if view is None:  # not the leader: only this queue's waiting list, order and reason
            view = queue_views(engine, top=0, waiting={name: engine.waiting_units(name)})[name]
        waiting = debug.pending_document(engine, name, pages.PAGE_UNITS)
        assert waiting is not None
        messages = {}
        for entry in waiting["pending"]:
            key = f"{entry['namespace']}/{entry['name']}"
            record = store.units.get(key)
            if record is not None and visible.namespace(entry["namespace"]):
                messages[key] = record.message
        fair = float(dominant_share_of(view.deserved, engine.engine.capacity()))
        return _html(pages.queue_page(ROOT, engine, view, waiting,
                                      pages.admitted_units(engine, name), visible, messages,
                                      shares.chart(name, fair)))

    async def unit_status(namespace: str, name: str, uid: str) -> Mapping[str, object] | None:
        """The QueueUnit's status as the apiserver has it (None: not read,
        or another object of that name)."""
        if api is None:
            return None
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                obj = await api.get(unit_path(namespace, name))
        except debug.REVIEW_ERRORS as error:  # the cache's record still says most
            log.info("web view: reading QueueUnit %s/%s failed: %s", namespace, name, error)
            return None
        if (obj.get("metadata") or {}).get("uid") != uid:
            return None
        # With the admission a unit created admitted carries until its
        # status is written (the fast path, DESIGN §16).
        return convert.unit_status(obj)

    async def unit_view(request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        visible = await seen(request)
        record = store.units.get(f"{namespace}/{name}")
        if record is None or not visible.namespace(namespace):
            # The same answer for a unit hidden and one that does not exist.
            return _html(f"no unit {escape(f'{namespace}/{name}'[:300])!r}", 404)
        engine = await mirror()
        status = await unit_status(namespace, name, record.uid)
        return _html(unit.unit_page(ROOT, record, engine, status, decisions.RECENT, visible))

    async def pools(request: web.Request) -> web.Response:
        visible = await seen(request)
        engine = await mirror()
        return _html(cluster.pools_page(ROOT, published_pools(engine),
                                        cluster.node_use(engine), visible))

    async def decided(request: web.Request) -> web.Response:
        visible = await seen(request)
        try:
            limit = int(request.query.get("limit", cluster.DECISIONS))
        except ValueError:
            return _html("limit must be an integer", 400)
        limit = max(0, min(limit, decisions.KEPT))
        return _html(cluster.decisions_page(ROOT, decisions.RECENT, visible, limit,
                                            request.query.get("queue", "")))

    async def events(request: web.Request) -> web.StreamResponse:
        return await live.stream(request, pulse, await seen(request))

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["file"]
        if name not in ASSETS:
            raise web.HTTPNotFound()
        return web.Response(body=(STATIC / name).read_bytes(), content_type=ASSETS[name],
                            headers={"Cache-Control": "max-age=300"})

    guard = debug.access_guard(access_mode, check, surface="the web view",
                               token_of=access.view_token)

    @web.middleware
    async def guarded(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        # The script and style hold no data, and the sign-in form needs them.
        if request.path.startswith(ROOT + "static/"):
            return await handler(request)
        response: web.StreamResponse = await guard(request, handler)
        return response

    app = web.Application(middlewares=[sign_in, guarded])
    app[SHARES] = shares
    app.router.add_get("/", queues)
    app.router.add_get("/queues/{name}", queue)
    app.router.add_get("/units/{namespace}/{name}", unit_view)
    app.router.add_get("/pools", pools)
    app.router.add_get("/decisions", decided)
    app.router.add_get("/events", events)
    app.router.add_get("/static/{file}", asset)

    sampler: list[asyncio.Task[None]] = []

    async def start(_: web.Application) -> None:
        store.listeners.append(table.on_change)
        sampler.append(asyncio.create_task(
            history.sample(shares, to_sample, clock, sample_every), name="web-view-shares"))

    async def shutdown(_: web.Application) -> None:
        pulse.close()
        for task in sampler:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(_: web.Application) -> None:
        if table.on_change in store.listeners:
            store.listeners.remove(table.on_change)
        view.close()

    app.on_startup.append(start)

    app.on_shutdown.append(shutdown)
    app.on_cleanup.append(close)
    return app
