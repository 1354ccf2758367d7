"""Read-only JSON debug API: a sub-application mounted at `/debug`.

- `GET /debug/queues`: every queue as Queue status shows it (allocated,
  deserved, dominantShare, pending, admitted, pendingUnits) plus why its
  head waits, the capacity and what is free.
- `GET /debug/queues/{name}/pending[?limit=N]`: that queue's waiting units
  in admission order, with each one's position and reason (default 100).

On the leader the numbers come from the running loop's engine; on another
replica from an engine rebuilt from its own cache, so every replica
answers. Both are rendered by `arbiter.loop.status.queue_views`, the same
function that writes Queue status and the `arbiter_queue_*` gauges.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from arbiter.cache.store import ClusterStore
from arbiter.loop.mirror import EngineMirror, mirror_from_store
from arbiter.loop.runtime import Leadership
from arbiter.loop.status import queue_views, split_key

PREFIX = "/debug"
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status,
                        content_type="application/json")


def _mirror(store: ClusterStore, overcommit: float,
            leadership: Leadership) -> tuple[EngineMirror, bool]:
    controller = leadership.controller
    if controller is not None:
        return controller.mirror, True
    return mirror_from_store(store, overcommit), False


def queues_document(mirror: EngineMirror, *, leader: bool) -> dict[str, Any]:
    views = queue_views(mirror)
    return {
        "leader": leader,
        "capacity": mirror.engine.capacity().to_quantities(),
        "free": mirror.engine.free().clamp_min(0).to_quantities(),
        "queues": {name: view.to_json() for name, view in views.items()},
    }


def pending_document(mirror: EngineMirror, name: str, limit: int) -> dict[str, Any] | None:
    if name not in mirror.queues:
        return None
    engine = mirror.engine
    units = mirror.waiting_units(name)
    entries = []
    for position, unit in enumerate(units[:limit], start=1):
        namespace, unit_name = split_key(unit.key)
        entries.append({
            "namespace": namespace,
            "name": unit_name,
            "priority": unit.priority,
            "position": position,
            "demand": unit.demand.to_quantities(),
            "reason": engine.explain_unit(unit.key) or "queue is Closed",
        })
    return {
        "queue": name,
        "total": len(units),
        "reason": engine.explain(name) if mirror.queues[name].state == "Open"
        else "queue is Closed: it admits nothing",
        "pending": entries,
    }


def debug_app(*, store: ClusterStore, overcommit: float,
              leadership: Leadership) -> web.Application:
    """The sub-application mounted at `PREFIX`."""
    async def queues(_: web.Request) -> web.Response:
        mirror, leader = _mirror(store, overcommit, leadership)
        return _json(queues_document(mirror, leader=leader))

    async def pending(request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", DEFAULT_LIMIT))
        except ValueError:
            return _json({"error": "limit must be an integer"}, 400)
        limit = max(0, min(limit, MAX_LIMIT))
        mirror, _ = _mirror(store, overcommit, leadership)
        document = pending_document(mirror, request.match_info["name"], limit)
        if document is None:
            return _json({"error": f"no queue {request.match_info['name']!r}"}, 404)
        return _json(document)

    app = web.Application()
    app.router.add_get("/queues", queues)
    app.router.add_get("/queues/{name}/pending", pending)
    return app
