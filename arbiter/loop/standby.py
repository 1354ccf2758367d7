"""A warm standby: a replica that does not lead keeps the engine in step
with the cache, so that when it takes the Lease its controller starts from
an engine that has every unit placed already (`AdmissionController(follow=)`)
and admits at once, instead of indexing and classifying the whole cache
first (seconds at 100,000 units: DESIGN §9's takeover budget is 2 s).

It is the loop's own change handling (`StoreFollower`), applied in slices
with the event loop free between them, a little after changes arrive
(coalesced: a burst of watch events is applied once)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from arbiter.cache.store import ClusterStore, Kind
from arbiter.loop.follow import StoreFollower

log = logging.getLogger(__name__)

# Units and pods applied between two yields of the event loop.
SLICE = 500
# Seconds changes gather before they are applied.
COALESCE = 0.05


class WarmStandby:
    def __init__(self, store: ClusterStore, overcommit: float) -> None:
        self.store = store
        self.follow = StoreFollower(store, overcommit)
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _on_change(self, kind: Kind, key: str) -> None:
        if self.follow.note(kind, key):
            self._changed.set()

    def start(self) -> None:
        self.store.listeners.append(self._on_change)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="warm-standby")

    async def _run(self) -> None:
        follow = self.follow
        await follow.resync(reindex=True, chunk=SLICE)
        while True:
            if follow.everything:
                await follow.resync(chunk=SLICE)
            caught_up = False
            while not caught_up:
                caught_up = follow.apply(time.time(), SLICE)
                await asyncio.sleep(0)  # the webhook runs between slices
            self._changed.clear()
            await self._changed.wait()
            await asyncio.sleep(COALESCE)

    async def take(self) -> StoreFollower | None:
        """Stop following and hand the follower over (None when it had not
        indexed the cache yet: the controller then starts cold). What is
        queued but not applied yet stays queued: the controller's first
        cycles look at it."""
        self.store.listeners.remove(self._on_change)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not self.follow.indexed or self.follow.everything:
            return None
        self.follow.apply(time.time())  # the last changes, before any admission
        return self.follow
