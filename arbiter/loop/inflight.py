"""What the admission loop knows about its own writes, and about the units
it is taking back, before the watch does: the one owner of in-flight state.

A write (create a unit, set its phase, admit it, release or hold its
consumer, take it back) runs as a task; its result reaches the cache only
when the watch delivers it, some milliseconds later. Until then a cycle
must not act on the stale version. Like kube-scheduler's cache, which
*assumes* a pod on its node before the binding lands and *forgets* it if
the binding fails, the loop keeps its writes' results here and lays them
over the store. The controller, its `UnitWriter`, the reclaimer and the
status publisher share one `InFlightWrites`; they read it and call its
operations, and only it changes its maps.

Every state a unit's in-flight write or eviction goes through, and who
moves it (C: the controller's cycle; W: the write's task, `UnitWriter` or
`reclaim.carry_out`; R: the reclaimer's look; T: a timer or TTL running
out). The key is a unit's `namespace/name`, or `create:<consumer>` for a
unit not created yet::

  WRITES                         (InFlightWrites; ASSUME_TTL = 30 s)

   C decides a write --spawn--> [busy] .... one write per key at a time
   (admit_all picked it: the       |        (locked); a busy key is not
    engine counts it admitted      |        decided again until it ends
    already: [admitting] until     |
    W ends, C does not classify    |
    it again meanwhile)            |  W: the API call
        +----------------+---------+-------+-------------------+
        | ok             | refused         | error             | create refused:
        v                v (changed/gone)  v                   v namespace deleting
   [assumed]        [outdated]        [retrying]          [namespace held]
     |                |                 |  T: 1s, 2s, 4s...   |  C: its Namespace is
     | C: the watch   | C: the watch    |  retry_max, then    |  deleted, or T:
     | shows our      | brings a newer  |  decided again (a   |  TERMINATING_HOLD
     | version, or T: | version: decided|  creation: C creates|  (60 s): its consumers'
     | ASSUME_TTL     | again           |  for its consumer)  |  units are created again
     v                v                 v                     v
   the store's      decided again     (back to the top)     (back to the top)

   [assumed] ends when the store has our version or a newer one
   (resourceVersions compare: `compare_resource_versions`); ASSUME_TTL
   ends it only when they do not compare, or the store has none.
   [assumed] has a twin for consumers, [override] (a Job we unsuspended
   reads as released until the watch shows it, or ASSUME_TTL passes).
   W setting TimeoutBackoff, or C finding a unit in it after a restart:
   [backing off] until the time it holds, when C decides again; C ends it
   when the unit leaves that phase.

  EVICTIONS                      (Evictions, owned by InFlightWrites;
                                  EVICTION_TTL = 120 s from being chosen)

   R chooses a victim --begin--> [taking] --W: refused, failed, unit gone
     (its room counts as free;      |        (abandon)--> forgotten: the next
      never chosen again)           |        look decides afresh
                                    |--W: a PodDisruptionBudget says no
                                    |  (block)--> [blocked] never chosen
                                    |  while its backoff runs (5 s doubling
                                    |  to 120 s); R forgets it after that,
                                    |  once the engine no longer counts it
                                    |  admitted
                                    |
                                    | R (expire): the engine no longer counts
                                    | it admitted, or it was admitted again,
                                    v or EVICTION_TTL
                                [draining]  its pods count on no node
                                    |
                                    | R (expire): its pods left their nodes,
                                    v or admitted again, or EVICTION_TTL
                                forgotten

EVICTION_TTL is longer than ASSUME_TTL: it covers pods terminating (their
grace period) and the engine catching up, not only the watch's lag. Timers
(`timer`, `due`, `next_deadline`) also wake the loop for the controller's
deadlines: admission timeouts, backoffs, reclaim looks, a namespace hold's
end. `forget(key)` drops what is kept for a unit that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Set
from dataclasses import dataclass

from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.records import UnitRecord
from arbiter.core.api import compare_resource_versions
from arbiter.core.reclaim.flat import Victim
from arbiter.loop.consumers import Consumer

log = logging.getLogger(__name__)

# How long a write's result may stand in for what the watch has not delivered.
ASSUME_TTL = 30.0
# A consumer write whose resourceVersion is known stands while the cache is
# older than it, up to this long.
VERSIONED_TTL = 600.0
# How long creations wait in a namespace found terminating, unless its
# Namespace event (deleted) comes first; then they are tried again.
TERMINATING_HOLD = 60.0
# Timer key (`timer`) that ends a namespace's hold.
HOLD_TIMER = "namespace:"
# How long after its victim was chosen an eviction is kept (taking, then
# draining) when its effect never showed.
EVICTION_TTL = 120.0
# An eviction a PodDisruptionBudget blocked: the unit is left alone this
# long, doubling with each block, capped.
BLOCKED_BASE = 5.0
BLOCKED_MAX = 120.0


@dataclass(slots=True)
class _Override:
    """What a consumer is after our write, until the watch shows it."""

    expected: Consumer
    before: Consumer
    until: float  # ASSUME_TTL after our write
    version: str = ""  # the consumer's resourceVersion after our write, when known

    @property
    def kept(self) -> float:
        """Until when it stands while the cache is known older than `version`
        (a bound, so that an override nobody looks at again still goes)."""
        return self.until + (VERSIONED_TTL - ASSUME_TTL if self.version else 0.0)


class InFlightWrites:
    """Writes in flight and what they assume, per unit key (the lifecycle:
    this module's docstring). `on_assumed` is told of every assumed record
    (the loop marks the unit for a look and wakes up)."""

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
        # The writer's: admissions running (the engine counts them admitted
        # already), TimeoutBackoff ends, creations to retry ("create:<consumer>"
        # -> consumer) and namespaces found terminating -> consumers whose
        # units wait for it to go (or for TERMINATING_HOLD).
        self._admitting: set[str] = set()
        self._backoff: dict[str, float] = {}
        self._creations: dict[str, ConsumerKey] = {}
        self._held: dict[str, set[ConsumerKey]] = {}
        self.evictions = Evictions()  # the reclaimer's

    # -- assumed writes --------------------------------------------------------------
    def assume(self, record: UnitRecord) -> None:
        """A write succeeded: `record` stands for the unit until the watch has it."""
        self._assumed[record.key] = (record, self.clock())
        self.on_assumed(record)

    def unit(self, key: str, stored: UnitRecord | None) -> UnitRecord | None:
        """The unit as the loop should see it, given what the store holds:
        our write's result until the store has that version or a newer one.
        A store known to be older keeps it past ASSUME_TTL: a watch that
        cannot resume (a restarted apiserver reinitializing its watch cache)
        would otherwise bring back a version our own write replaced, and the
        loop would act on it. The TTL applies when the versions do not
        compare, or the store has none."""
        assumed = self._assumed.get(key)
        if assumed is None:
            return stored
        record, since = assumed
        if stored is not None:
            order = compare_resource_versions(stored.resource_version,
                                              record.resource_version)
            if order == -1:
                # The watch is behind our write; an older version under
                # another uid is a deleted namesake's, older still.
                return record
            if order is not None:
                del self._assumed[key]  # confirmed or passed by the watch
                return stored
        if self.clock() - since > ASSUME_TTL:
            del self._assumed[key]  # taken as lost
            return stored
        return record

    def assumed_keys(self) -> list[str]:
        return list(self._assumed)

    def override(self, consumer: ConsumerKey, expected: Consumer, before: Consumer,
                 version: str = "") -> None:
        """We changed `consumer` from `before` to `expected` (its
        resourceVersion then `version`, when known); the watch will follow."""
        self._overrides[consumer] = _Override(expected, before, self.clock() + ASSUME_TTL,
                                              version)

    def consumer(self, key: ConsumerKey | None, state: Consumer, version: str = "") -> Consumer:
        """`state` (the cache's, at resourceVersion `version` when known)
        with our unseen write applied. While the cache is known to be older
        than our write, the write stands past ASSUME_TTL (as `unit`'s do):
        a Job watch minutes behind under load would otherwise bring back
        the Job our suspend replaced, and the loop would act on it."""
        if key is None or not self._overrides:
            return state
        override = self._overrides.get(key)
        if override is None:
            return state
        if state is override.before:
            order = compare_resource_versions(version, override.version) \
                if version and override.version else None
            now = self.clock()
            if (order == -1 and now < override.kept) or (order is None and now < override.until):
                return override.expected
        del self._overrides[key]
        return state

    def expire_overrides(self, now: float) -> None:
        """Drop overrides of consumers nobody looked at again."""
        for key in [k for k, o in self._overrides.items() if o.kept < now]:
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

    def spawn(self, work: Callable[[], Awaitable[None]], *, key: str | None = None,
              queued: bool = True) -> None:
        """Run a write as a task, at most `max_writes` at once; `key` is busy
        from now until the write ends. `work` makes the coroutine only when
        its turn comes (a cancelled task leaves no coroutine behind that was
        never awaited). `queued=False`: the write does not wait for a turn
        among the unit writes. For Queue and Pool status, bounded by their
        own count and rate: behind a backlog of thousands of unit writes
        they were minutes stale, though each is one write per object."""
        if key is not None:
            self._busy.add(key)
        task = asyncio.get_running_loop().create_task(self._limited(work, key, queued))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _limited(self, work: Callable[[], Awaitable[None]], key: str | None,
                       queued: bool) -> None:
        try:
            if queued:
                async with self._limit:
                    await work()
            else:
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

    # -- admissions running --------------------------------------------------------------
    def admission_started(self, key: str) -> None:
        """The engine picked `key` (it counts it admitted from now on) and its
        admission write is starting."""
        self._admitting.add(key)

    def admission_ended(self, key: str) -> None:
        """The admission write ended (written or not): classify the unit again
        from what it reads as now."""
        self._admitting.discard(key)

    def admission_running(self, key: str) -> bool:
        return key in self._admitting

    # -- TimeoutBackoff ---------------------------------------------------------------------
    def back_off(self, key: str, until: float) -> None:
        """The unit is in TimeoutBackoff until `until`."""
        self._backoff[key] = until

    def backoff_end(self, key: str) -> float | None:
        return self._backoff.get(key)

    def end_backoff(self, key: str) -> None:
        """The unit left TimeoutBackoff."""
        self._backoff.pop(key, None)

    # -- creations ---------------------------------------------------------------------------
    def retry_creation(self, key: str, consumer: ConsumerKey) -> None:
        """Creating `consumer`'s unit (busy key `key`) failed: when `key`'s
        retry timer fires, `woken` names the consumer."""
        self._creations[key] = consumer

    def hold_namespace(self, namespace: str, consumer: ConsumerKey) -> bool:
        """The apiserver refused a creation in `namespace`, being deleted:
        `consumer` waits there (with any others) until the namespace is gone
        or TERMINATING_HOLD passes. True when the namespace was not held yet."""
        new = namespace not in self._held
        if new:
            self._held[namespace] = set()
            self.timer(self.clock() + TERMINATING_HOLD, HOLD_TIMER + namespace)
        self._held[namespace].add(consumer)
        return new

    def held_in(self, namespace: str, consumer: ConsumerKey) -> bool:
        """Creations in `namespace` wait (`hold_namespace`): so does `consumer`'s."""
        waiting = self._held.get(namespace)
        if waiting is None:
            return False
        waiting.add(consumer)
        return True

    def namespace_gone(self, namespace: str) -> set[ConsumerKey]:
        """The namespace was deleted (a new one of that name starts afresh),
        or its hold is over: the consumers whose creations waited, to look at
        again."""
        return self._held.pop(namespace, set())

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

    def woken(self, key: str) -> set[ConsumerKey] | None:
        """Whom a fired timer `key` is for: the consumer whose unit's
        creation is retried, or those a namespace's hold (now over) kept
        waiting; None: unit `key` itself."""
        consumer = self._creations.pop(key, None)
        if consumer is not None:
            return {consumer}
        if key.startswith(HOLD_TIMER):
            return self.namespace_gone(key.removeprefix(HOLD_TIMER))
        return None

    def forget(self, key: str) -> None:
        """The unit is gone: drop its retries, timer, backoff and outdated version."""
        self._backoff.pop(key, None)
        self._outdated.pop(key, None)
        self._retry_at.pop(key, None)
        self._failures.pop(key, None)
        self._timer_at.pop(key, None)


@dataclass(slots=True)
class Taking:
    """A victim being taken back."""

    victim: Victim
    since: float  # when it was chosen
    # The unit's admission attempt when chosen: a later one means it was
    # requeued and admitted again (perhaps within one cycle, never seen
    # waiting): taken back, and no longer in flight.
    attempt: int | None = None


class Evictions:
    """The units the reclaimer is taking back, per unit key (the lifecycle:
    this module's docstring, EVICTIONS). `now` is the caller's cycle time."""

    def __init__(self) -> None:
        self._taking: dict[str, Taking] = {}  # chosen; until the engine lets go of it
        # Taken back, pods perhaps still terminating on their nodes: those
        # pods count nowhere (`NodeModel.set_leaving`).
        self._draining: dict[str, tuple[float, int | None]] = {}  # key -> (since, attempt)
        self._blocked: dict[str, tuple[float, int]] = {}  # key -> (until, times)
        self._first_blocked: dict[str, float] = {}  # for the PodDisruptionBudget timeout

    def begin(self, victim: Victim, now: float, attempt: int | None) -> None:
        """The reclaimer chose `victim` (its admission `attempt` as the loop has it)."""
        self._taking[victim.unit.key] = Taking(victim, now, attempt)

    def abandon(self, key: str) -> None:
        """Taking `key` back failed or is moot (changed, gone): the next look
        decides afresh."""
        self._taking.pop(key, None)

    def block(self, key: str, now: float) -> float:
        """A PodDisruptionBudget blocked the eviction: leave `key` alone for
        a while (doubling); returns the delay."""
        _, times = self._blocked.get(key, (0.0, 0))
        self._first_blocked.setdefault(key, now)
        delay = min(BLOCKED_MAX, BLOCKED_BASE * 2.0 ** times)
        self._blocked[key] = (now + delay, times + 1)
        self._taking.pop(key, None)
        return delay

    def expire(self, now: float, *, admitted: Callable[[str], bool],
               readmitted: Callable[[str, int | None], bool],
               on_nodes: Callable[[str], bool]) -> None:
        """Move on what the engine and the nodes show is done: `admitted(key)`
        the engine counts it admitted; `readmitted(key, attempt)` it was
        admitted again since; `on_nodes(key)` pods of it still hold room."""
        for key in [k for k, f in self._taking.items()
                    if not admitted(k) or readmitted(k, f.attempt)
                    or now - f.since > EVICTION_TTL]:
            flight = self._taking.pop(key)
            self._draining[key] = (flight.since, flight.attempt)
        for key in [k for k, (since, attempt) in self._draining.items()
                    if now - since > EVICTION_TTL or readmitted(k, attempt)
                    or (not admitted(k) and not on_nodes(k))]:
            del self._draining[key]
        for key in [k for k, (until, _) in self._blocked.items()
                    if until <= now and not admitted(k)]:
            del self._blocked[key]
            self._first_blocked.pop(key, None)

    def taking(self) -> Mapping[str, Taking]:
        """The victims being taken back (a live, read-only view)."""
        return self._taking

    def draining(self) -> Mapping[str, tuple[float, int | None]]:
        return self._draining

    def leaving(self) -> set[str]:
        """Units whose pods count on no node: taking or draining."""
        return self._taking.keys() | self._draining.keys()

    def held_back(self, now: float) -> set[str]:
        """Units whose blocked eviction's backoff still runs: not chosen now."""
        return {k for k, (until, _) in self._blocked.items() if until > now}

    def first_blocked(self, key: str) -> float | None:
        """When a PodDisruptionBudget first blocked `key`'s eviction."""
        return self._first_blocked.get(key)
