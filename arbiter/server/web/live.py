"""The event stream (`GET /view/events`, server-sent events): each
queue's waiting and admitted counts and dominant share, pushed to open
pages when they change.

One `Pulse` per application, shared by every client: it follows the
store's change notifications while a client is connected, and after a
change reads the counts (from the same engine the pages render) after
`DEBOUNCE` seconds and again every `INTERVAL` for `SETTLE` seconds (the
leader's loop applies a change shortly after the store sees it), then once
every `IDLE` seconds. So a change shows within about a second, however
many arrive, at most 1 / INTERVAL times a second. Each client is sent
only what changed since its last message, of the queues it may see.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator

import orjson
from aiohttp import web

from arbiter.cache.store import ClusterStore, Kind
from arbiter.core.engine.flat import format_share
from arbiter.core.resources import Resources
from arbiter.loop.mirror import EngineMirror
from arbiter.server.web.access import Visibility

log = logging.getLogger(__name__)

DEBOUNCE = 0.1
INTERVAL = 0.25
SETTLE = 1.0
IDLE = 5.0
# Seconds between two comments that keep an idle stream open; clients at
# once, and per user (a token's user name), so one tenant cannot hold them all.
PING = 15.0
MAX_CLIENTS = 64
MAX_PER_USER = 8
# Seconds between two looks at whether a stream's client went away: a
# page left does not hold its place in the caps until the next ping.
CHECK = 1.0

Counts = dict[str, tuple[int, int, float]]  # queue -> (waiting, admitted, share)


class CountsReader:
    """Each queue's counts from an engine, in slices of `SLICE` queues
    (yielding between them: a thousand dominant shares take milliseconds),
    a share computed again only when what the queue holds or the
    capacity changed."""

    SLICE = 50

    def __init__(self) -> None:
        self._shares: dict[str, tuple[Resources, Resources, float]] = {}

    async def __call__(self, mirror: EngineMirror) -> Counts:
        engine = mirror.engine
        capacity = engine.capacity()
        names = list(mirror.queues)
        counts: Counts = {}
        for start in range(0, len(names), self.SLICE):
            for name in names[start:start + self.SLICE]:
                allocated = engine.allocated(name)
                known = self._shares.get(name)
                if known is None or known[0] != allocated or known[1] != capacity:
                    known = (allocated, capacity, format_share(engine.dominant_share(name)))
                    self._shares[name] = known
                counts[name] = (mirror.waiting.get(name, 0), mirror.admitted.get(name, 0),
                                known[2])
            await asyncio.sleep(0)
        if len(self._shares) > len(counts):
            self._shares = {name: self._shares[name] for name in counts if name in self._shares}
        return counts


class Pulse:
    """The latest counts, and a version that moves when they change."""

    def __init__(self, store: ClusterStore,
                 read: Callable[[], Awaitable[EngineMirror]]) -> None:
        self.store = store
        self.read = read
        self.counts_of = CountsReader()
        self.counts: Counts = {}
        self.version = 0
        self.clients = 0
        self.users: Counter[str] = Counter()  # open streams per user ("" uncounted)
        self._changed = asyncio.Event()
        self._published = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.closed = False

    def on_change(self, kind: Kind, key: str) -> None:
        self._changed.set()

    def full(self, who: str) -> str:
        """Why one more stream for user `who` is refused ("" when it is not)."""
        if self.clients >= MAX_CLIENTS:
            return "too many open views; retry later"
        if who and self.users[who] >= MAX_PER_USER:
            return f"{MAX_PER_USER} views are open for this user already; close one"
        return ""

    @contextlib.contextmanager
    def connected(self, who: str = "") -> Iterator[None]:
        """While a client is connected: follow the store (the first one
        starts it, the last one stops it)."""
        self.clients += 1
        if who:
            self.users[who] += 1
        if self._task is None:
            self.store.listeners.append(self.on_change)
            self._task = asyncio.create_task(self._run(), name="web-view-pulse")
        try:
            yield
        finally:
            self.clients -= 1
            if who:
                self.users[who] -= 1
                if not self.users[who]:
                    del self.users[who]
            if self.clients == 0:
                self.stop()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            self.store.listeners.remove(self.on_change)

    def close(self) -> None:
        """The server stops: every stream ends."""
        self.closed = True
        self.stop()
        self._published.set()

    async def wait(self, version: int) -> None:
        """Until the counts are newer than `version` (or the pulse closed)."""
        while self.version == version and not self.closed:
            await self._published.wait()

    async def _run(self) -> None:
        await self._publish()
        settle_until = 0.0
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            timeout = INTERVAL if now < settle_until else IDLE
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()
            if self._changed.is_set():
                self._changed.clear()
                await asyncio.sleep(DEBOUNCE)  # let a burst of changes land together
                settle_until = loop.time() + SETTLE
            await self._publish()
            await asyncio.sleep(max(0.0, INTERVAL - DEBOUNCE))

    async def _publish(self) -> None:
        try:
            counts = await self.counts_of(await self.read())
        except Exception:  # a view that failed once must not end every stream
            log.exception("web view: reading the counts failed")
            return
        if counts != self.counts:
            self.counts = counts
            self.version += 1
            published, self._published = self._published, asyncio.Event()
            published.set()


def changed(counts: Counts, sent: Counts, visible: Visibility) -> tuple[Counts, list[str]]:
    """What a client was not sent yet: counts that differ, queues gone."""
    now = {name: value for name, value in counts.items()
           if visible.queue(name) and sent.get(name) != value}
    gone = [name for name in sent if name not in counts]
    return now, gone


async def stream(request: web.Request, pulse: Pulse, visible: Visibility) -> web.StreamResponse:
    """Server-sent events until the client leaves or the server stops."""
    refused = pulse.full(visible.who)
    if refused:
        # 429 for one user over its share, 503 for the server full.
        error = web.HTTPTooManyRequests if pulse.clients < MAX_CLIENTS \
            else web.HTTPServiceUnavailable
        raise error(text=refused, headers={"Retry-After": "5"})
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-store",
        "X-Accel-Buffering": "no"})
    await response.prepare(request)
    sent: Counts = {}
    version = -1
    loop = asyncio.get_running_loop()
    with pulse.connected(visible.who), contextlib.suppress(ConnectionError):
        await response.write(b"retry: 2000\n\n")
        written = loop.time()
        while not pulse.closed and not _gone(request):
            try:
                async with asyncio.timeout(CHECK):
                    await pulse.wait(version)
            except TimeoutError:
                if loop.time() - written >= PING:
                    await response.write(b": ping\n\n")
                    written = loop.time()
                continue
            if pulse.closed:
                break
            version = pulse.version
            now, gone = changed(pulse.counts, sent, visible)
            if not now and not gone:
                continue
            for name in gone:
                sent.pop(name)
            sent.update(now)
            message = {"queues": {name: list(value) for name, value in now.items()},
                       "gone": gone}
            await response.write(b"data: " + orjson.dumps(message) + b"\n\n")
            written = loop.time()
    return response


def _gone(request: web.Request) -> bool:
    """Whether the client closed its connection (aiohttp does not cancel
    the handler: a write would find out, at the next message or ping)."""
    transport = request.transport
    return transport is None or transport.is_closing()
