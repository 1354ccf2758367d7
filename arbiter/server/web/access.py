"""Who may open the web view, and which queues each caller sees.

The guard is the debug API's (`arbiter.server.debug.access_guard`): with
`loopback` only clients on this host, who see every queue; with `token` a
token the apiserver authenticates (TokenReview, with the debug API's cache
and per-source budgets), carried as `Authorization: Bearer` or, from a
browser, in the `arbiter-view-token` cookie. Such a caller sees a queue when
it may list QueueUnits in some namespace the queue admits
(SubjectAccessReview per namespace, cached like the token's answer), or
every queue when it may list them in all namespaces.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

from arbiter.cache import access as queue_access
from arbiter.cache.store import ClusterStore
from arbiter.server import debug

COOKIE = "arbiter-view-token"
# What "may read a namespace" means here: list its QueueUnits (a tenant
# holds that in its own namespaces; DESIGN §13).
READ = {"group": "arbiter.dev", "resource": "queueunits", "verb": "list"}
# Namespace answers remembered at most, and reviews in flight at once.
MAX_ANSWERS = 100_000
CONCURRENT_REVIEWS = 8


def view_token(request: web.Request) -> str:
    """The bearer token, else the cookie a browser was given."""
    return debug.bearer_token(request) or request.cookies.get(COOKIE, "").strip()


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ViewerReviewer(debug.TokenReviewer):
    """The debug API's reviewer, answering "is this anyone the apiserver
    knows" and remembering who, so each namespace can be asked about."""

    def __init__(self, api: Any, *, clock: Callable[[], float] = time.monotonic,
                 **kwargs: Any) -> None:
        super().__init__(api, clock=clock, **kwargs)
        self._users: dict[str, dict[str, Any]] = {}
        self._answers: dict[tuple[str, str], tuple[bool, float]] = {}
        # user -> (namespaces it may read, how many namespaces there were,
        # until): a caller's requests within the answers' lifetime cost a
        # lookup, not a walk of every namespace (a new namespace: asked again).
        self._readable: dict[str, tuple[frozenset[str] | None, int, float]] = {}
        self._reviews = asyncio.Semaphore(CONCURRENT_REVIEWS)

    async def _review(self, token: str) -> bool:
        user = await self.authenticate(token)
        if user is None:
            return False
        digest = _digest(token)
        self._users.pop(digest, None)
        while len(self._users) >= self.max_tokens:
            del self._users[next(iter(self._users))]
        self._users[digest] = user
        return True

    def user(self, token: str) -> dict[str, Any] | None:
        """Who a token the guard let through is."""
        return self._users.get(_digest(token))

    async def readable(self, user: dict[str, Any], store: ClusterStore) -> frozenset[str] | None:
        """The managed namespaces `user` may list QueueUnits in (None: all)."""
        who = _who(user)
        now = self.clock()
        known = self._readable.get(who)
        if known is not None and known[2] > now and known[1] == len(store.namespaces):
            return known[0]
        found: frozenset[str] | None = None
        if not await self.may_read(user, ""):
            managed = [name for name in store.namespaces if store.is_managed_namespace(name)]
            answers = await asyncio.gather(*(self.may_read(user, name) for name in managed))
            found = frozenset(name for name, ok in zip(managed, answers, strict=True) if ok)
        if len(self._readable) >= self.max_tokens:
            self._readable.clear()
        self._readable[who] = (found, len(store.namespaces), now + self.ttl)
        return found

    async def may_read(self, user: dict[str, Any], namespace: str) -> bool:
        """Whether `user` may list QueueUnits in `namespace` ("" = all)."""
        key = (_who(user), namespace)
        now = self.clock()
        known = self._answers.get(key)
        if known is not None and known[1] > now:
            return known[0]
        async with self._reviews:
            attributes = {**READ, "namespace": namespace} if namespace else READ
            allowed = await self.allowed(user, attributes)
        if len(self._answers) >= MAX_ANSWERS:
            self._answers.clear()
        self._answers[key] = (allowed, now + self.ttl)
        return allowed


class Visibility:
    """Which queues and namespaces one caller may see (None: all), and who
    the caller is (the token's user name; "" on loopback)."""

    def __init__(self, namespaces: frozenset[str] | None, queues: frozenset[str] | None,
                 who: str = "") -> None:
        self.namespaces = namespaces
        self.queues = queues
        self.who = who

    @property
    def everything(self) -> bool:
        return self.namespaces is None and self.queues is None

    def queue(self, name: str) -> bool:
        return self.queues is None or name in self.queues

    def namespace(self, name: str) -> bool:
        return self.namespaces is None or name in self.namespaces

    def filter(self, names: Iterable[str]) -> list[str]:
        return [name for name in names if self.queue(name)]


EVERYTHING = Visibility(None, None)


async def visibility(request: web.Request, store: ClusterStore,
                     reviewer: ViewerReviewer | None) -> Visibility:
    """What the caller of `request` (already through the guard) may see."""
    if reviewer is None:
        return EVERYTHING  # loopback: this host's own users see everything
    user = reviewer.user(view_token(request))
    if user is None:
        return Visibility(frozenset(), frozenset())
    who = str(user["username"])
    readable = await reviewer.readable(user, store)
    if readable is None:
        return Visibility(None, None, who)
    queues: set[str] = set()
    for name in readable:
        queues.update(store.admitting_queues(name))
    if readable:
        queues.update(name for name, record in store.queues.items()
                      if queue_access.open_queue(record))
    return Visibility(readable, frozenset(queues), who)


def _who(user: dict[str, Any]) -> str:
    """A user as the apiserver authorizes it: name and groups."""
    return f"{user['username']}\n{sorted(user.get('groups') or [])}"
