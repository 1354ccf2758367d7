"""The web view's routes, a sub-application mounted at `PREFIX`:

    GET /view/                 the queues page
    GET /view/queues/{name}    one queue: its waiting units and why, its admitted units
    GET /view/events           server-sent events: counts as they change (live.py)
    GET /view/static/...       view.js, view.css

Every page reads the engine the debug API reads (`debug.current_mirror`:
the leader's own, or a kept view on another replica), so the view, the
debug API, Queue status and `arbiter queues` agree.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from html import escape
from pathlib import Path

from aiohttp import web

from arbiter.cache.store import ClusterStore
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.runtime import Leadership
from arbiter.loop.status import QueueView, queue_views
from arbiter.server import debug
from arbiter.server.web import access, live, pages

PREFIX = "/view"
ROOT = PREFIX + "/"
STATIC = Path(__file__).parent / "static"
ASSETS = {"view.js": "text/javascript", "view.css": "text/css"}


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
            reviewer: access.ViewerReviewer | None = None,
            clock: Callable[[], float] = time.time) -> web.Application:
    """The sub-application mounted at `PREFIX` (`reviewer`: with `token`)."""
    view = debug.KeptView(store, overcommit, clock)
    check = reviewer if access_mode == "token" else None

    async def mirror() -> EngineMirror:
        return (await debug.current_mirror(view, leadership))[0]

    pulse = live.Pulse(store, mirror)
    table = pages.QueuesPage()

    def published() -> Mapping[str, QueueView] | None:
        """The views the leader's loop last published (None elsewhere)."""
        controller = leadership.controller
        return controller.publisher.views if controller is not None else None

    async def seen(request: web.Request) -> access.Visibility:
        return await access.visibility(request, store, check)

    async def queues(request: web.Request) -> web.Response:
        visible = await seen(request)
        return _html(table.render(ROOT, await mirror(), visible, published()))

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
        return _html(pages.queue_page(ROOT, engine, view, waiting,
                                      pages.admitted_units(engine, name), visible, messages))

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
    app.router.add_get("/", queues)
    app.router.add_get("/queues/{name}", queue)
    app.router.add_get("/events", events)
    app.router.add_get("/static/{file}", asset)

    async def start(_: web.Application) -> None:
        store.listeners.append(table.on_change)

    async def shutdown(_: web.Application) -> None:
        pulse.close()

    async def close(_: web.Application) -> None:
        if table.on_change in store.listeners:
            store.listeners.remove(table.on_change)
        view.close()

    app.on_startup.append(start)

    app.on_shutdown.append(shutdown)
    app.on_cleanup.append(close)
    return app
