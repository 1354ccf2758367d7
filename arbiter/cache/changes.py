"""Waiting, briefly, for one record of the cache to change.

A webhook answer that depends on an object this replica's watch has not
delivered yet (a Job the Job controller makes pods for a moment after its
creation, or after the leader started it) is the cache lagging, not the
object being wrong. Denying it costs the caller a retry with backoff (the
Job controller's is seconds); waiting a fraction of a second for the watch
usually turns the answer. `ChangeWaiter` is a store listener: a waiter
asks for (kind, key) and is woken by the next change of that record.

Bounded: at most `limit` waiters at once; past that, `changed` answers
False at once, so a flood of such requests (or a tenant forging them)
holds no more than `limit` requests open, each for at most its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib

from arbiter.cache.store import Kind


class ChangeWaiter:
    def __init__(self, limit: int = 512) -> None:
        self.limit = limit
        self._waiting: dict[tuple[Kind, str], list[asyncio.Future[None]]] = {}
        self._count = 0

    @property
    def waiting(self) -> int:
        return self._count

    def on_change(self, kind: Kind, key: str) -> None:
        """The store's listener: wake whoever waits for this record."""
        futures = self._waiting.pop((kind, key), None)
        for future in futures or ():
            if not future.done():
                future.set_result(None)

    async def changed(self, kind: Kind, key: str, within: float) -> bool:
        """Wait up to `within` seconds for the next change of (kind, key):
        True when it changed, False on the deadline or when too many wait."""
        if within <= 0 or self._count >= self.limit:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiting.setdefault((kind, key), [])
        waiters.append(future)
        self._count += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, within)
            return future.done() and not future.cancelled()
        finally:
            self._count -= 1
            left = self._waiting.get((kind, key))
            if left is not None and future in left:
                left.remove(future)
                if not left:
                    del self._waiting[(kind, key)]
