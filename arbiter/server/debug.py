"""Read-only JSON debug API: a sub-application mounted at `/debug` on the
metrics listener, off by default (`--debug-api`).

- `GET /debug/queues`: every queue as Queue status shows it (allocated,
  deserved, dominantShare, pending, admitted, pendingUnits) plus why its
  head waits, the capacity and what is free.
- `GET /debug/queues/{name}/pending[?limit=N]`: that queue's waiting units
  in admission order, with each one's position and reason (default 100).

Who may call it (DESIGN §13): with `--debug-api loopback` only clients on
this host (a peer address of 127.0.0.0/8 or ::1); with `token` a bearer
token the apiserver accepts (TokenReview) for a user allowed to `get`
Queues (SubjectAccessReview); answers are cached for a minute, so a client
polling the API does not cost the apiserver a review per request.

On the leader the numbers come from the running loop's engine; on another
replica from a `KeptView`: one engine kept in step with the cache's change
notifications by the loop's own change handling (`arbiter.loop.follow`:
the same nodes, pools, namespace access and charges), each request
applying only what changed since the last (in slices, yielding the event
loop), never a rebuild. Both are rendered by
`arbiter.loop.status.queue_views`, the same function that writes Queue
status and the `arbiter_queue_*` gauges.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import aiohttp
import orjson
from aiohttp import web

from arbiter.base.kubeapi import ApiError, request_json
from arbiter.base.ratelimit import KeyedBuckets, TokenBucket
from arbiter.cache.store import ClusterStore
from arbiter.loop.follow import StoreFollower
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.runtime import Leadership
from arbiter.loop.status import queue_views, split_key

log = logging.getLogger(__name__)

DebugAccess = Literal["off", "loopback", "token"]
# Units applied to a KeptView between two yields of the event loop.
SLICE = 500
# Seconds a token's positive review is reused; tokens remembered at most.
TOKEN_TTL = 60.0
MAX_TOKENS = 1000
# Reviews of tokens not known good, per second and in a burst, per client
# address; and for all addresses together (the apiserver's share). A flood
# of random tokens spends its own source's budget (or at worst the shared
# one), never the re-review of a token already known good.
REVIEW_RATE = 5.0
REVIEW_BURST = 20
TOTAL_REVIEW_RATE = 20.0
TOTAL_REVIEW_BURST = 80
MAX_SOURCES = 1024

PREFIX = "/debug"
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status,
                        content_type="application/json")


class KeptView:
    """An engine over the cache, kept in step with the store's change
    notifications by the loop's own `StoreFollower` (for replicas that do
    not lead): the leader's nodes, pools, namespace access and charges, so
    its answers are the leader's but for the writes the leader has in
    flight. `refreshed()` applies what changed since its last call, `SLICE`
    units at a time."""

    def __init__(self, store: ClusterStore, overcommit: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.follow = StoreFollower(store, overcommit)
        self._following = False
        self._lock = asyncio.Lock()

    @property
    def following(self) -> bool:
        """Whether it follows the store (it was read once)."""
        return self._following

    def close(self) -> None:
        if self._following:
            self.store.listeners.remove(self.follow.on_change)
            self._following = False

    async def refreshed(self) -> EngineMirror:
        async with self._lock:
            follow = self.follow
            if not self._following:
                # Once: follow the store, then index and look at everything.
                self.store.listeners.append(follow.on_change)
                self._following = True
                await follow.resync(reindex=True, chunk=SLICE)
            done = False
            while not done:
                if follow.everything:  # rare (a Namespace, a Queue's access): all again
                    await follow.resync(chunk=SLICE)
                done = follow.apply(self.clock(), SLICE)
                await asyncio.sleep(0)  # let the webhook run between slices
            return follow.mirror


async def current_mirror(view: KeptView,
                         leadership: Leadership) -> tuple[EngineMirror, bool]:
    """The leader's engine while this replica leads, else `view` brought up
    to date; and whether it is the leader's."""
    controller = leadership.controller
    if controller is not None:
        return controller.mirror, True
    return await view.refreshed(), False


# A bearer token and the caller's address -> whether it may read the debug API.
TokenCheck = Callable[[str, str], Awaitable[bool]]


REVIEW_ERRORS = (ApiError, aiohttp.ClientError, TimeoutError, OSError, ValueError)


class ReviewsThrottled(Exception):
    """Too many tokens to review right now (answered 429)."""


class TokenReviewer:
    """Bearer tokens checked with the apiserver: TokenReview (who is it),
    then SubjectAccessReview (may they `get` Queues). Answers are cached
    for `ttl` seconds by the token's SHA-256 (positive and negative alike,
    so a flood of one bad token costs one review a minute); concurrent
    requests with one token share one review.

    Reviews of tokens not known good are rate-limited per client address
    and in all (`ReviewsThrottled` past either budget). A token once found
    good is re-reviewed when its answer expires without spending any
    budget (there are at most `max_tokens` such, each once per `ttl`), and
    good and bad answers are kept apart, so a flood of random tokens, from
    one address or many, neither loads the apiserver nor locks out or
    evicts a token in use."""

    def __init__(self, api: Any, *, ttl: float = TOKEN_TTL,
                 clock: Callable[[], float] = time.monotonic,
                 rate: float = REVIEW_RATE, burst: int = REVIEW_BURST,
                 total_rate: float = TOTAL_REVIEW_RATE, total_burst: int = TOTAL_REVIEW_BURST,
                 max_tokens: int = MAX_TOKENS) -> None:
        self.api = api
        self.ttl = ttl
        self.clock = clock
        self.max_tokens = max_tokens
        self._per_source = KeyedBuckets(rate, burst, MAX_SOURCES)
        self._total = TokenBucket(total_rate, total_burst, clock())
        # digest -> expiry, good and bad tokens apart; insertion-ordered
        # (re-inserted on every review), so the first is the oldest.
        self._good: dict[str, float] = {}
        self._bad: dict[str, float] = {}
        self._reviewing: dict[str, asyncio.Future[bool]] = {}

    async def __call__(self, token: str, source: str = "") -> bool:
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        for answers, allowed in ((self._good, True), (self._bad, False)):
            expiry = answers.get(digest)
            if expiry is not None and expiry > now:
                return allowed
        running = self._reviewing.get(digest)
        if running is not None:
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                if running.cancelled():  # its caller went away: deny, the client retries
                    return False
                raise
        if digest not in self._good:
            self._take_budget(source, now)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._reviewing[digest] = future
        try:
            allowed = await self._review(token)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: waiters re-raise it, none is required
            raise
        finally:
            del self._reviewing[digest]
        future.set_result(allowed)
        self._good.pop(digest, None)
        self._bad.pop(digest, None)
        answers = self._good if allowed else self._bad
        while len(answers) >= self.max_tokens:
            del answers[next(iter(answers))]
        answers[digest] = now + self.ttl
        return allowed

    def _take_budget(self, source: str, now: float) -> None:
        # The source's budget first: a throttled source spends none of the total.
        if not self._per_source.take(source, now) or not self._total.take(now):
            raise ReviewsThrottled

    async def _review(self, token: str) -> bool:
        user = await self.authenticate(token)
        return user is not None and await self.allowed(
            user, {"group": "arbiter.dev", "resource": "queues", "verb": "get"})

    async def authenticate(self, token: str) -> dict[str, Any] | None:
        """Who `token` is (TokenReview's `status.user`), or None."""
        try:
            review = await request_json(
                self.api, "POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                      "spec": {"token": token}})
        except REVIEW_ERRORS as error:
            log.warning("token review failed", extra={"error": str(error)})
            return None
        status = review.get("status") or {}
        user = status.get("user") or {}
        if not status.get("authenticated") or not isinstance(user.get("username"), str):
            return None
        return dict(user)

    async def allowed(self, user: dict[str, Any], attributes: dict[str, str]) -> bool:
        """Whether `user` (as `authenticate` returned it) may do what the
        SubjectAccessReview `resourceAttributes` say."""
        try:
            access = await request_json(
                self.api, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": {"user": user["username"], "groups": user.get("groups") or [],
                               "uid": user.get("uid") or "",
                               "resourceAttributes": attributes}})
        except REVIEW_ERRORS as error:
            log.warning("access review failed", extra={"error": str(error)})
            return False
        return bool((access.get("status") or {}).get("allowed"))


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def bearer_token(request: web.Request) -> str:
    """The request's `Authorization: Bearer` token, or ""."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def access_guard(access: DebugAccess, check_token: TokenCheck | None, *,
                 surface: str = "the debug API",
                 token_of: Callable[[web.Request], str] = bearer_token) -> Any:
    """The middleware that lets only allowed callers through (`token_of`:
    where a request carries its token)."""
    @web.middleware
    async def guard(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        if access == "loopback":
            if not _is_loopback(request.remote):
                return _json({"error": f"{surface} answers on loopback only"}, 403)
        else:
            token = token_of(request)
            if not token:
                return _json({"error": "a bearer token is required"}, 401)
            try:
                allowed = check_token is not None and await check_token(
                    token, request.remote or "")
            except ReviewsThrottled:
                response = _json({"error": "too many new tokens to review; retry later"}, 429)
                response.headers["Retry-After"] = "1"
                return response
            if not allowed:
                return _json({"error": f"the token may not read {surface}"}, 403)
        return await handler(request)

    return guard


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


def debug_app(*, store: ClusterStore, overcommit: float, leadership: Leadership,
              access: DebugAccess = "loopback",
              check_token: TokenCheck | None = None,
              clock: Callable[[], float] = time.time) -> web.Application:
    """The sub-application mounted at `PREFIX`, for callers `access` allows
    (`clock`: the time a replica's view judges delays by)."""
    view = KeptView(store, overcommit, clock)

    async def queues(_: web.Request) -> web.Response:
        mirror, leader = await current_mirror(view, leadership)
        return _json(queues_document(mirror, leader=leader))

    async def pending(request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", DEFAULT_LIMIT))
        except ValueError:
            return _json({"error": "limit must be an integer"}, 400)
        limit = max(0, min(limit, MAX_LIMIT))
        mirror, _ = await current_mirror(view, leadership)
        document = pending_document(mirror, request.match_info["name"], limit)
        if document is None:
            return _json({"error": f"no queue {request.match_info['name']!r}"}, 404)
        return _json(document)

    async def integrations(_: web.Request) -> web.Response:
        # The kinds switched on, and the declared ones that are not (why).
        return _json({"on": [i.kind for i in store.integrations],
                      "declaredOff": dict(store.declared_off)})

    app = web.Application(middlewares=[access_guard(access, check_token)])
    app.router.add_get("/queues", queues)
    app.router.add_get("/integrations", integrations)
    app.router.add_get("/queues/{name}/pending", pending)

    async def close(_: web.Application) -> None:
        view.close()

    app.on_cleanup.append(close)
    return app
