"""What the admission loop knows about its own writes before the watch does.

A write (create a unit, set its phase, admit it, release or hold its
consumer, take it back) runs as a task; its result reaches the cache only
when the watch delivers it, some milliseconds later. Until then a cycle
must not act on the stale version. Like kube-scheduler's cache, which
*assumes* a pod on its node before the binding lands and *forgets* it if
the binding fails, the loop keeps its writes' results here and lays them
over the store. The controller and the reclaimer share one `InFlightWrites`;
neither touches the other's members.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Set
from dataclasses import dataclass

from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.records import UnitRecord
from arbiter.loop.units import Consumer

log = logging.getLogger(__name__)

# How long a write's result may stand in for what the watch has not delivered.
ASSUME_TTL = 30.0


@dataclass(slots=True)
class _Override:
    """What a consumer is after our write, until the watch shows it."""

    expected: Consumer
    before: Consumer
    until: float


class InFlightWrites:
    r"""Writes in flight and what they assume, per unit key.

    The lifecycle of one write (the key is a unit's `namespace/name`, or
    `create:<consumer>` for a unit not created yet)::

      cycle decides a write
              |  spawn(work, key)       at most max_writes run at once;
              v                         locked(key): one write on a key at
         +---------+                    a time; a busy key is not decided
         |  busy   |                    again until its write ends
         +---------+
              |  the API call
     +--------+-------------------+-------------------------+
     | ok                         | refused (changed / gone) | error
     v                            v                          v
   assume(record)              conflicted(unit)            failed(key)
   succeeded(key)              this version is outdated:   retry_at(key) after
     |                         decide again on the next    1s, 2s, 4s ... retry_max
     v                         one the watch brings        and timer(retry_at, key)
   +---------+                                               |
   | assumed |  unit(key, stored) returns our record         | due(now): looked at
   +---------+                                               | again, write again
     |                    \                                  v
     | the watch shows     \ ASSUME_TTL passes               (back to the top)
     | our resourceVersion  \ without it
     v                       v
   confirmed: the store's  expired: the store's (our write is taken as lost)

    Consumers follow the same lifecycle through `override` (a Job we
    unsuspended reads as released until the watch shows it, or ASSUME_TTL
    passes). Timers (`timer`, `due`, `next_deadline`) also wake the loop for
    the controller's deadlines: admission timeouts, backoffs, reclaim looks.
    `forget(key)` drops what is kept for a unit that is gone.

    `on_assumed` is told of every assumed record (the loop marks the unit
    for a look and wakes up).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        max_writes: int,
        retry_base: float = 1.0,
        retry_max: float = 60.0,
        on_assumed: Callable[[UnitRecord], None] = lambda _: None,
    ) -> None:
        self.clock = clock
        self.retry_base = retry_base
        self.retry_max = retry_max
        self.on_assumed = on_assumed
        self.failures_total = 0
        self._assumed: dict[str, tuple[UnitRecord, float]] = {}  # key -> (record, since)
        self._overrides: dict[ConsumerKey, _Override] = {}
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._limit = asyncio.Semaphore(max_writes)
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # key -> (lock, users)
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._timers: list[tuple[float, str]] = []
        self._timer_at: dict[str, float] = {}
        self._outdated: dict[str, str] = {}  # unit key -> resourceVersion a write found changed

    # -- assumed writes --------------------------------------------------------------
    def assume(self, record: UnitRecord) -> None:
        """A write succeeded: `record` stands for the unit until the watch has it."""
        self._assumed[record.key] = (record, self.clock())
        self.on_assumed(record)

    def unit(self, key: str, stored: UnitRecord | None) -> UnitRecord | None:
        """The unit as the loop should see it, given what the store holds."""
        assumed = self._assumed.get(key)
        if assumed is None:
            return stored
        record, since = assumed
        if (stored is not None and stored.resource_version == record.resource_version) \
                or self.clock() - since > ASSUME_TTL:
            del self._assumed[key]  # confirmed by the watch, or taken as lost
            return stored
        return record

    def assumed_keys(self) -> list[str]:
        return list(self._assumed)

    def override(self, consumer: ConsumerKey, expected: Consumer, before: Consumer) -> None:
        """We changed `consumer` from `before` to `expected`; the watch will follow."""
        self._overrides[consumer] = _Override(expected, before, self.clock() + ASSUME_TTL)

    def consumer(self, key: ConsumerKey | None, state: Consumer) -> Consumer:
        """`state` (the cache's) with our unseen write applied."""
        if key is None or not self._overrides:
            return state
        override = self._overrides.get(key)
        if override is None:
            return state
        if state is override.before and self.clock() < override.until:
            return override.expected
        del self._overrides[key]
        return state

    def expire_overrides(self, now: float) -> None:
        """Drop overrides of consumers nobody looked at again."""
        for key in [k for k, o in self._overrides.items() if o.until < now]:
            del self._overrides[key]

    def conflicted(self, unit: UnitRecord) -> None:
        """A write found `unit` changed under it (or gone): this version is
        outdated; decide again once the watch brings a newer one."""
        self._outdated[unit.key] = unit.resource_version

    def outdated(self, unit: UnitRecord) -> bool:
        known = self._outdated.get(unit.key)
        if known is None:
            return False
        if known != unit.resource_version:
            del self._outdated[unit.key]  # a newer version came
            return False
        return True

    # -- writes running ------------------------------------------------------------------
    def busy(self, key: str) -> bool:
        """A write on `key` is running (decide nothing about it meanwhile)."""
        return key in self._busy

    def busy_keys(self) -> Set[str]:
        """The keys with a write running (a live, read-only view)."""
        return self._busy

    def spawn(self, work: Callable[[], Awaitable[None]], *, key: str | None = None) -> None:
        """Run a write as a task, at most `max_writes` at once; `key` is busy
        from now until the write ends. `work` makes the coroutine only when
        its turn comes (a cancelled task leaves no coroutine behind that was
        never awaited)."""
        if key is not None:
            self._busy.add(key)
        task = asyncio.get_running_loop().create_task(self._limited(work, key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _limited(self, work: Callable[[], Awaitable[None]], key: str | None) -> None:
        try:
            async with self._limit:
                await work()
        finally:
            if key is not None:
                self._busy.discard(key)

    @contextlib.asynccontextmanager
    async def locked(self, key: str) -> AsyncIterator[None]:
        """One write at a time on `key` (an admission and a position write
        both patch the unit's status)."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def running(self) -> int:
        return len(self._tasks)

    async def wait(self) -> None:
        """Until every write running now has ended."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Cancel every write still running."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- retries ---------------------------------------------------------------------------
    def failed(self, key: str, error: BaseException) -> float:
        """A write failed: try `key` again later, exponentially; returns the delay."""
        count = self._failures.get(key, 0) + 1
        self._failures[key] = count
        delay = min(self.retry_max, self.retry_base * 2.0 ** (count - 1))
        self._retry_at[key] = self.clock() + delay
        self.timer(self._retry_at[key], key)
        self.failures_total += 1
        log.warning("write for %s failed (%s); retrying in %.1fs", key, error, delay)
        return delay

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)
        self._retry_at.pop(key, None)

    def retry_at(self, key: str) -> float:
        """When `key` may be written again after a failure (0: any time)."""
        return self._retry_at.get(key, 0.0)

    # -- timers ------------------------------------------------------------------------------
    def timer(self, when: float, key: str) -> None:
        """Look at `key` again at `when` (once per distinct time)."""
        if self._timer_at.get(key) == when:
            return
        self._timer_at[key] = when
        heapq.heappush(self._timers, (when, key))

    def timer_for(self, key: str) -> float | None:
        return self._timer_at.get(key)

    def due(self, now: float) -> list[str]:
        """The keys with a timer that has fired by `now`, in time order, each
        once. A key whose timer was moved is due at either time (a look too
        many costs nothing: each look sets the timers it still needs)."""
        fired: dict[str, None] = {}
        while self._timers and self._timers[0][0] <= now:
            when, key = heapq.heappop(self._timers)
            if self._timer_at.get(key) == when:
                del self._timer_at[key]
            fired[key] = None
        return list(fired)

    def next_deadline(self) -> float:
        """When the first timer fires (infinity: none is set)."""
        return self._timers[0][0] if self._timers else math.inf

    def forget(self, key: str) -> None:
        """The unit is gone: drop its retries, timer and outdated version."""
        self._outdated.pop(key, None)
        self._retry_at.pop(key, None)
        self._failures.pop(key, None)
        self._timer_at.pop(key, None)
