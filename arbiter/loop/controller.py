"""The admission loop: event-driven cycles that keep QueueUnits, admit them in
the engine's order and carry out what that means.

One cycle (synchronous, so it sees one consistent store):

1. consumers that changed (Jobs, gated pods, pod groups) get their unit
   created, or a waiting unit's spec brought up to date;
2. units that changed are classified (`units.disposition`) into the engine
   (pending / admitted / out) and get the step `units.decide` picks
   (phase transitions, finishing an interrupted release, timeouts);
3. `admit_all()` on the engine; every unit it picks is *assumed* admitted
   in the engine at once and its write (status first, then release) runs
   as a task. A failed write undoes the assumption: the unit is classified
   again from what the store says.

Cycles are woken by store listeners and debounced by a few milliseconds; a
timer wakes the loop only for deadlines (admission timeouts, backoffs,
retries). Writes whose result the watch has not delivered yet are kept as
an overlay (`_assumed`) so no cycle acts on a stale unit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from arbiter import metrics
from arbiter.api import UnitPhase
from arbiter.cache.records import PodRecord, UnitRecord
from arbiter.cache.store import ClusterStore, Kind
from arbiter.core.fairshare import Unit
from arbiter.core.resources import Resources
from arbiter.kubeapi import ApiError, ClusterApi
from arbiter.loop.actions import Actions, ConsumerGone, Written
from arbiter.loop.index import LoopIndex
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.reclaim import Reclaimer, ReclaimSettings
from arbiter.loop.status import (
    QueueMetrics,
    QueueStatusWriter,
    QueueView,
    Throttle,
    TokenBucket,
    positions,
    queue_views,
)
from arbiter.loop.units import (
    Consumer,
    ConsumerKey,
    DesiredUnit,
    Step,
    admission_deadline,
    backoff_delay,
    consumer_key,
    decide,
    demand_of,
    disposition,
    group_state,
    group_unit,
    job_state,
    job_unit,
    pod_state,
    pod_unit,
    spec_drift,
)

log = logging.getLogger(__name__)

# How long a write's result may stand in for what the watch has not delivered.
ASSUME_TTL = 30.0


class EventSink(Protocol):
    """Where the loop reports what happened to a unit (arbiter.loop.events)."""

    def unit_event(self, unit: UnitRecord, type_: str, reason: str, message: str,
                   *, on_unit: bool = True) -> None: ...


@dataclass(frozen=True, slots=True)
class LoopSettings:
    overcommit: float = 1.0
    admission_timeout: float = 300.0
    backoff_base: float = 10.0
    backoff_max: float = 600.0
    debounce: float = 0.005
    # API writes in flight at once. Each admission is three sequential
    # writes (unit, status, release); under a slow apiserver (~0.3 s a call)
    # 32 capped the loop at ~30 admissions/s, 128 kept up with creation.
    max_writes: int = 100
    resync_interval: float = 600.0
    # Consumers + units one cycle looks at before yielding the event loop.
    batch: int = 500
    retry_base: float = 1.0
    retry_max: float = 60.0
    # Status writes: one object at most once per interval, all together
    # under `status_qps` a second.
    status_interval: float = 2.0
    status_qps: float = 20.0
    # Waiting events go to the first units of each queue only, and positions
    # are kept up to date for the first `position_depth` (beyond, a unit's
    # position is not written: at 100,000 waiting units it would be a write
    # storm for a number nobody acts on).
    waiting_event_depth: int = 100
    position_depth: int = 1000
    # Seconds a queue starves below its deserved share before it reclaims
    # (arbiter.loop.reclaim).
    reclaim_grace: float = 30.0


@dataclass(slots=True)
class _Assumed:
    record: UnitRecord
    since: float


@dataclass(slots=True)
class _Override:
    """What a consumer is after our write, until the watch shows it."""

    expected: Consumer
    before: Consumer
    until: float


@dataclass(slots=True)
class CycleStats:
    cycles: int = 0
    admitted: int = 0
    last_duration: float = 0.0
    created: int = 0
    writes_failed: int = 0


def consumer_state(
    store: ClusterStore, index: LoopIndex, unit: UnitRecord, key: ConsumerKey | None = None
) -> tuple[Consumer, tuple[PodRecord, ...]]:
    """What the unit's consumer (`key`, when known already) is doing, as the
    cache sees it, and its pods."""
    ref = unit.consumer
    if key is None:
        key = consumer_key(unit)
    if key is None or ref is None:
        return Consumer.NONE, ()
    if key.kind == "Job":
        return job_state(store.jobs.get(f"{key.namespace}/{key.name}"), ref.uid), ()
    if key.kind == "Pod":
        pod = store.pod_by_name(key.namespace, key.name)
        return pod_state(pod, ref.uid), ((pod,) if pod is not None else ())
    pods = tuple(index.group_pods(store, key.namespace, key.name))
    return group_state(pods), pods


def mirror_from_store(store: ClusterStore, overcommit: float = 1.0) -> EngineMirror:
    """An engine over the units as the cache has them, with no loop behind it
    (for replicas that do not lead: the debug API still answers)."""
    index = LoopIndex()
    index.rebuild(store)
    mirror = EngineMirror()
    mirror.set_queues(store.queues)
    mirror.set_capacity(store.capacity(overcommit))
    for key, unit in store.units.items():
        state, pods = consumer_state(store, index, unit)
        mirror.set(key, disposition(unit, state),
                   engine_unit(unit, submitted(store, unit, pods)))
    return mirror


def submitted(store: ClusterStore, unit: UnitRecord, pods: tuple[PodRecord, ...]) -> float:
    """When the work was submitted: its consumer's creation (the Job, the
    pod, the group's first pod) — the unit follows by milliseconds that may
    cross a second — or the unit's own for a reservation."""
    ref = unit.consumer
    if ref is not None and ref.kind == "Job":
        job = store.jobs.get(f"{unit.namespace}/{ref.name}")
        if job is not None and job.created:
            return job.created
    elif pods:
        first = min(p.created for p in pods)
        if first:
            return first
    return unit.created


def engine_unit(unit: UnitRecord, created: float | None = None) -> Unit:
    return Unit(
        key=unit.key,
        queue=unit.queue,
        demand=demand_of(unit.pod_sets),
        priority=unit.priority,
        created=unit.created if created is None else created,
    )


class AdmissionController:
    def __init__(
        self,
        store: ClusterStore,
        api: ClusterApi,
        settings: LoopSettings | None = None,
        *,
        events: EventSink | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        identity: str = "",
    ) -> None:
        self.store = store
        self.settings = settings or LoopSettings()
        self.actions = Actions(api, identity=identity)
        self.events = events
        self.clock = clock
        self.rng = rng or random.Random()
        self.mirror = EngineMirror()
        self.index = LoopIndex()
        self.stats = CycleStats()
        # What the next cycle must look at.
        self._all = True
        self._queues_dirty = True
        self._capacity_dirty = True
        self._units: set[str] = set()
        self._consumers: set[ConsumerKey] = set()
        # Writes in flight and what they assume.
        self._assumed: dict[str, _Assumed] = {}
        self._overrides: dict[ConsumerKey, _Override] = {}
        self._busy: set[str] = set()  # unit keys (and "create:<consumer>") with a write running
        self._admitting: set[str] = set()
        self._stale: dict[str, str] = {}  # unit key -> resourceVersion known to be outdated
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._backoff_until: dict[str, float] = {}
        self._blocked_names: set[str] = set()
        self._timers: list[tuple[float, str]] = []
        self._timer_at: dict[str, float] = {}
        self._create_retry: dict[str, ConsumerKey] = {}  # "create:<consumer>" -> consumer
        self._tasks: set[asyncio.Task[None]] = set()
        self._limit = asyncio.Semaphore(self.settings.max_writes)
        self._wake = asyncio.Event()
        self._next_resync = 0.0
        self._listening = False
        self._indexed = False
        self.warming = True
        self._nodes_seen: dict[str, tuple[Resources, bool, bool]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Status publishing.
        self.views: dict[str, QueueView] = {}
        self.queue_metrics = QueueMetrics()
        self.queue_writer = QueueStatusWriter(api, interval=self.settings.status_interval)
        self.position_throttle = Throttle(self.settings.status_interval)
        self.status_bucket = TokenBucket(self.settings.status_qps,
                                         max(1.0, self.settings.status_qps * 2), clock())
        self._waiting_said: dict[str, str] = {}
        self.reclaimer = Reclaimer(ReclaimSettings(grace=self.settings.reclaim_grace))

    # -- wiring ---------------------------------------------------------------------------
    def start_listening(self) -> None:
        if not self._listening:
            self.store.listeners.append(self.on_change)
            self._listening = True

    def stop_listening(self) -> None:
        if self._listening:
            self.store.listeners.remove(self.on_change)
            self._listening = False

    def on_change(self, kind: Kind, key: str) -> None:
        """Store listener: note what changed and wake the loop."""
        if kind == "QueueUnit":
            self._units.add(key)
            self._consumers.update(self.index.on_unit(key, self.store.units.get(key)))
        elif kind == "Job":
            namespace, _, name = key.partition("/")
            consumer = ConsumerKey("Job", namespace, name)
            self._consumers.add(consumer)
        elif kind == "Pod":
            touched, capacity = self.index.on_pod(key, self.store.pods.get(key))
            self._consumers.update(touched)
            self._capacity_dirty = self._capacity_dirty or capacity
        elif kind == "Queue":
            self._queues_dirty = True
        elif kind == "Node":
            # Heartbeats change a Node every few seconds; only what the
            # capacity is made of counts.
            node = self.store.nodes.get(key)
            seen = (node.allocatable, node.ready, node.schedulable) if node is not None else None
            if self._nodes_seen.get(key) == seen:
                return
            if seen is None:
                self._nodes_seen.pop(key, None)
            else:
                self._nodes_seen[key] = seen
            self._capacity_dirty = True
        elif kind == "Namespace":
            self._all = True
        else:
            return
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    # -- views over store + in-flight writes ---------------------------------------------
    def unit(self, key: str) -> UnitRecord | None:
        """The unit as the loop should see it: our last write until the watch has it."""
        stored = self.store.units.get(key)
        assumed = self._assumed.get(key)
        if assumed is None:
            return stored
        if (stored is not None and stored.resource_version == assumed.record.resource_version) \
                or self.clock() - assumed.since > ASSUME_TTL:
            del self._assumed[key]
            return stored
        return assumed.record

    def _assume(self, written: Written) -> None:
        record = written.record
        self._assumed[record.key] = _Assumed(record, self.clock())
        if record.key not in self.store.units:
            self._consumers.update(self.index.on_unit(record.key, record))
        self._units.add(record.key)
        self._wake.set()

    def _override(self, consumer: ConsumerKey, expected: Consumer, before: Consumer) -> None:
        self._overrides[consumer] = _Override(expected, before, self.clock() + ASSUME_TTL)

    def consumer(self, unit: UnitRecord) -> tuple[Consumer, tuple[PodRecord, ...]]:
        """What the unit's consumer is doing (with our unseen writes applied)."""
        key = consumer_key(unit)
        state, pods = consumer_state(self.store, self.index, unit, key)
        override = self._overrides.get(key) if key is not None and self._overrides else None
        if override is not None and key is not None:
            if state is override.before and self.clock() < override.until:
                return override.expected, pods
            del self._overrides[key]
        return state, pods

    # -- the cycle -----------------------------------------------------------------------------
    def cycle(self, budget: int | None = None) -> list[Unit]:
        """One decision pass over what changed (at most `budget` consumers and
        units; the rest stay queued for the next pass); returns the units
        admitted. Nothing is admitted before every unit has been classified
        once (`warming`): an admitted unit the engine did not know yet could
        be admitted over."""
        started = time.perf_counter()
        now = self.clock()
        store = self.store
        if self._all:
            self._all = False
            if not self._indexed:
                self.index.rebuild(store)
                self._indexed = True
            self._consumers.update(self.index.consumers(store))
            self._units.update(store.units)
            self._units.update(self._assumed)
            self._queues_dirty = self._capacity_dirty = True
            self._next_resync = now + self.settings.resync_interval
        while self._timers and self._timers[0][0] <= now:
            when, key = heapq.heappop(self._timers)
            if self._timer_at.get(key) == when:
                del self._timer_at[key]
            retry = self._create_retry.pop(key, None)
            if retry is not None:
                self._consumers.add(retry)  # a unit creation to try again
            else:
                self._units.add(key)

        if self._queues_dirty:
            self.mirror.set_queues(store.queues)
            self._queues_dirty = False
        if self._capacity_dirty:
            self.mirror.set_capacity(store.capacity(self.settings.overcommit))
            self._capacity_dirty = False

        left = budget if budget is not None else -1
        consumers, units = self._consumers, self._units
        while consumers and left != 0:
            self._reconcile_consumer(consumers.pop(), units)
            left -= 1
        while units and left != 0:
            self._reconcile_unit(units.pop(), now)
            left -= 1
        if self.warming and not consumers and not units:
            self.warming = False

        chosen = [] if self.warming else self.mirror.admit_all()
        for unit in chosen:
            record = self.unit(unit.key)
            if record is None:  # cannot happen: only known units are pending
                self.mirror.set(unit.key, None, None)
                continue
            self._admitting.add(unit.key)
            self._busy.add(unit.key)
            self._spawn(functools.partial(self._admit, record, unit))
        if not self.warming:
            self.reclaimer.after_cycle(self, now)  # take back what others need
        duration = time.perf_counter() - started
        self.stats.cycles += 1
        self.stats.admitted += len(chosen)
        self.stats.last_duration = duration
        metrics.admission_cycle_duration_seconds.observe(duration)
        return chosen

    async def resync(self, *, reindex: bool = False, chunk: int = 1000) -> None:
        """Queue every consumer and unit for a look, in slices, yielding
        between them (a new leader with a large cache must not stall the
        webhook that shares this event loop). With `reindex`, rebuild the
        index first; listeners keep it current meanwhile, because each entry
        is indexed from the store as it is *now*."""
        store = self.store
        if reindex:
            self.index = LoopIndex()
            for count, key in enumerate(list(store.units), start=1):
                self.index.on_unit(key, store.units.get(key))
                if count % chunk == 0:
                    await asyncio.sleep(0)
            for count, uid in enumerate(list(store.pods), start=1):
                self.index.on_pod(uid, store.pods.get(uid))
                if count % chunk == 0:
                    await asyncio.sleep(0)
            self._indexed = True
        consumers = self.index.consumers(store)
        for start in range(0, len(consumers), chunk):
            self._consumers.update(consumers[start:start + chunk])
            await asyncio.sleep(0)
        keys = [*store.units, *self._assumed]
        for start in range(0, len(keys), chunk):
            self._units.update(keys[start:start + chunk])
            await asyncio.sleep(0)
        self._queues_dirty = self._capacity_dirty = True
        self._all = False
        self._next_resync = self.clock() + self.settings.resync_interval

    def _desired(self, consumer: ConsumerKey) -> DesiredUnit | None:
        store = self.store
        if not store.is_managed_namespace(consumer.namespace):
            return None
        if consumer.kind == "Job":
            job = store.jobs.get(f"{consumer.namespace}/{consumer.name}")
            return job_unit(job, store.priority_classes) if job is not None else None
        if consumer.kind == "Pod":
            pod = store.pod_by_name(consumer.namespace, consumer.name)
            return pod_unit(pod) if pod is not None else None
        pods = self.index.group_pods(store, consumer.namespace, consumer.name)
        return group_unit(consumer.namespace, consumer.name, pods)

    def _consumer_uid(self, consumer: ConsumerKey) -> str | None:
        """The consumer's uid ("" for a pod group); None when it does not exist."""
        if consumer.kind == "Job":
            job = self.store.jobs.get(f"{consumer.namespace}/{consumer.name}")
            return job.uid if job is not None else None
        if consumer.kind == "Pod":
            pod = self.store.pod_by_name(consumer.namespace, consumer.name)
            return pod.uid if pod is not None else None
        return ""

    def _reconcile_consumer(self, consumer: ConsumerKey, units: set[str]) -> None:
        existing = [u for u in map(self.unit, self.index.units_for(consumer)) if u is not None]
        units.update(u.key for u in existing)
        uid = self._consumer_uid(consumer)
        if uid is None or not self.store.is_managed_namespace(consumer.namespace):
            return
        mine = [
            u for u in existing
            if u.consumer is not None
            and (not u.consumer.uid or not uid or u.consumer.uid == uid)
        ]
        if mine:
            # Only a waiting Job's unit follows its consumer (parallelism);
            # a pod's requests and a group's members are fixed once created.
            unit = mine[0]
            if consumer.kind == "Job" and unit.phase == "Enqueued" \
                    and unit.key not in self._busy \
                    and self._stale.get(unit.key) != unit.resource_version:
                wanted = self._desired(consumer)
                drift = spec_drift(unit, wanted) if wanted is not None else None
                if drift is not None:
                    self._busy.add(unit.key)
                    self._spawn(functools.partial(self._update_spec, unit, drift))
            return
        desired = self._desired(consumer)
        if desired is None:
            return
        taken = self.unit(desired.key)
        if taken is not None:
            # A namesake unit: a reservation, or the unit of a deleted
            # predecessor the garbage collector has not removed yet.
            if desired.key not in self._blocked_names:
                self._blocked_names.add(desired.key)
                log.warning("cannot create QueueUnit %s for %s: the name is taken",
                            desired.key, consumer)
            return
        self._blocked_names.discard(desired.key)
        busy = f"create:{consumer}"
        if busy in self._busy or self._retry_at.get(busy, 0.0) > self.clock():
            return
        self._busy.add(busy)
        self._spawn(functools.partial(self._create, busy, desired))

    def _reconcile_unit(self, key: str, now: float) -> None:
        unit = self.unit(key)
        if unit is None:
            self.mirror.set(key, None, None)
            self._forget(key)
            return
        if self._stale.get(key) not in (None, unit.resource_version):
            del self._stale[key]
        consumer, pods = self.consumer(unit)
        if key not in self._admitting:
            where = disposition(unit, consumer)
            if where == "pending" and (
                self._stale.get(key) == unit.resource_version
                or self._retry_at.get(key, 0.0) > now
            ):
                where = None  # wait for the watch, or for the retry time
            self.mirror.set(key, where, engine_unit(unit, submitted(self.store, unit, pods)))
        if unit.phase != "TimeoutBackoff":
            self._backoff_until.pop(key, None)
        elif key not in self._backoff_until:
            # Found in backoff (a restart): wait the backoff out again from now.
            self._backoff_until[key] = now + self._backoff_delay(unit.attempts)
        if key in self._busy or self._stale.get(key) == unit.resource_version:
            return  # a write is running, or we know this version is outdated
        retry = self._retry_at.get(key, 0.0)
        if retry > now:
            self._timer(retry, key)
            return
        step = decide(unit, consumer, now=now, timeout=self.settings.admission_timeout,
                      backoff_until=self._backoff_until.get(key))
        if step.kind == "none":
            deadline = admission_deadline(unit, self.settings.admission_timeout)
            if deadline is not None:
                self._timer(deadline, key)
            if unit.phase == "TimeoutBackoff":
                self._timer(self._backoff_until[key], key)
            return
        self._busy.add(key)
        self._spawn(functools.partial(self._step, unit, step))

    def _forget(self, key: str) -> None:
        self._stale.pop(key, None)
        self._retry_at.pop(key, None)
        self._failures.pop(key, None)
        self._backoff_until.pop(key, None)
        self._timer_at.pop(key, None)

    def _timer(self, when: float, key: str) -> None:
        if self._timer_at.get(key) == when:
            return
        self._timer_at[key] = when
        heapq.heappush(self._timers, (when, key))

    def _backoff_delay(self, attempts: int) -> float:
        return backoff_delay(attempts, base=self.settings.backoff_base,
                             cap=self.settings.backoff_max, jitter=self.rng.random())

    def _failed(self, key: str, error: BaseException) -> None:
        """A write failed: retry the key later, exponentially."""
        count = self._failures.get(key, 0) + 1
        self._failures[key] = count
        delay = min(self.settings.retry_max, self.settings.retry_base * 2 ** (count - 1))
        self._retry_at[key] = self.clock() + delay
        self._timer(self._retry_at[key], key)  # a "create:" key wakes its consumer
        self.stats.writes_failed += 1
        log.warning("write for %s failed (%s); retrying in %.1fs", key, error, delay)

    def _succeeded(self, key: str) -> None:
        self._failures.pop(key, None)
        self._retry_at.pop(key, None)

    # -- writes (tasks) --------------------------------------------------------------------
    def _spawn(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run a write as a task, at most `max_writes` at once. `work` makes
        the coroutine only when its turn comes (a cancelled task leaves no
        coroutine behind that was never awaited)."""
        task = asyncio.get_running_loop().create_task(self._limited(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _limited(self, work: Callable[[], Awaitable[None]]) -> None:
        async with self._limit:
            await work()

    async def _create(self, busy: str, desired: DesiredUnit) -> None:
        try:
            written = await self.actions.create_unit(desired)
            if written is not None:
                self._assume(written)
                self.stats.created += 1
            self._succeeded(busy)
        except ApiError as error:
            self._create_retry[busy] = desired.consumer
            self._failed(busy, error)
        finally:
            self._busy.discard(busy)
            self._consumers.add(desired.consumer)
            self._wake.set()

    async def _update_spec(self, unit: UnitRecord, spec: dict[str, Any]) -> None:
        try:
            written = await self.actions.update_spec(unit, spec)
            if written is None:
                self._stale[unit.key] = unit.resource_version
            else:
                self._assume(written)
        except ApiError as error:
            self._failed(unit.key, error)
        finally:
            self._busy.discard(unit.key)
            self._units.add(unit.key)
            self._wake.set()

    def _key_lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _unlock(self, key: str) -> None:
        lock = self._locks.get(key)
        if lock is not None and not lock.locked():
            del self._locks[key]

    async def _admit(self, unit: UnitRecord, chosen: Unit) -> None:
        """Status first (the admission record), then release the consumer."""
        key = unit.key
        admitted = False
        try:
            async with self._key_lock(key):
                # A position write may have run meanwhile: start from its result.
                unit = self.unit(key) or unit
                now = self.clock()
                written = await self.actions.admit(unit, now)
            self._unlock(key)
            if written is None:
                # Changed under us (or gone): decide again on the newer version.
                self._stale[key] = unit.resource_version
                return
            admitted = True
            self._assume(written)
            self._succeeded(key)
            metrics.admitted_units_total.labels(unit.queue).inc()
            if unit.admissions == 0 and chosen.created:
                metrics.admission_wait_seconds.labels(unit.queue).observe(
                    max(0.0, now - chosen.created))
            if self.events is not None:
                # On the Job or pod (where users look); on the unit only when
                # it has none: its status says it already, and every Event
                # is an apiserver write competing with admissions.
                self.events.unit_event(written.record, "Normal", "Admitted",
                                       f"admitted by queue {unit.queue}", on_unit=False)
            await self._release(written.record)
        except ApiError as error:
            if not admitted:
                self._failed(key, error)
        finally:
            self._admitting.discard(key)
            self._busy.discard(key)
            self._units.add(key)
            self._wake.set()

    async def _release(self, unit: UnitRecord) -> None:
        key = consumer_key(unit)
        state, pods = self.consumer(unit)
        try:
            await self.actions.release(unit, pods)
        except ConsumerGone:
            # Gone (the watch will say so): do not try again meanwhile.
            if key is not None:
                self._override(key, Consumer.MISSING, state)
            return
        except ApiError as error:
            self._failed(unit.key, error)
            return
        if key is not None and state is Consumer.HELD:
            self._override(key, Consumer.RELEASED, Consumer.HELD)

    async def _step(self, unit: UnitRecord, step: Step) -> None:
        key = unit.key
        try:
            if step.kind == "release":
                await self._release(unit)
            elif step.kind == "hold":
                await self._hold(unit)
            elif step.kind == "phase" and step.phase is not None:
                await self._set_phase(unit, step.phase, step.message)
            elif step.kind == "backoff":
                written = await self._set_phase(unit, "TimeoutBackoff", step.message)
                if written is not None:
                    delay = self._backoff_delay(written.record.attempts)
                    self._backoff_until[key] = self.clock() + delay
                    if self.events is not None:
                        self.events.unit_event(
                            written.record, "Warning", "Backoff",
                            f"{step.message}; next try in {delay:.0f}s "
                            f"(attempt {written.record.attempts})")
                    await self._hold(written.record)
        except ApiError as error:
            self._failed(key, error)
        finally:
            self._busy.discard(key)
            self._units.add(key)
            self._wake.set()

    async def _set_phase(self, unit: UnitRecord, phase: UnitPhase, message: str) -> Written | None:
        written = await self.actions.set_phase(unit, phase, message)
        if written is None:
            self._stale[unit.key] = unit.resource_version
            return None
        self._assume(written)
        self._succeeded(unit.key)
        return written

    async def _hold(self, unit: UnitRecord) -> None:
        key = consumer_key(unit)
        state, _ = self.consumer(unit)
        try:
            await self.actions.hold(unit)
        except ConsumerGone:
            if key is not None:
                self._override(key, Consumer.MISSING, state)
            return
        self._succeeded(unit.key)
        if key is not None and state in (Consumer.RELEASED, Consumer.RUNNING):
            self._override(key, Consumer.HELD, state)

    # -- status ------------------------------------------------------------------------------
    def waiting(self) -> dict[str, list[Unit]]:
        """Every queue's waiting units in admission order."""
        return {name: self.mirror.waiting_units(name)
                for name in self.mirror.queues if self.mirror.waiting.get(name)}

    async def publish(self) -> None:
        """One status round: metrics, Queue statuses, positions, Waiting events."""
        now = self.clock()
        for key in [k for k, o in self._overrides.items() if o.until < now]:
            del self._overrides[key]  # consumers nobody looked at again
        waiting = self.waiting()
        views = queue_views(self.mirror, waiting=waiting)
        self.views = views
        self.queue_metrics.update(views)
        for view in self.queue_writer.due(views, now):
            if not self.status_bucket.take(now):
                break
            self._spawn(functools.partial(self._write_queue, view, now))
        depth = self.settings.position_depth
        self._publish_positions(positions(self.mirror, waiting=waiting, depth=depth), now)
        self._waiting_events(views, waiting)

    def _publish_positions(self, where: dict[str, int], now: float) -> None:
        for key, position in sorted(where.items(), key=lambda item: item[1]):
            if key in self._busy:
                continue
            unit = self.unit(key)
            if unit is None or unit.position == position:
                continue
            if not self.position_throttle.due(key, position, now):
                continue
            if not self.status_bucket.take(now):
                break
            self._busy.add(key)
            self._spawn(functools.partial(self._write_position, unit, position))
        self.position_throttle.forget(where)

    async def _write_position(self, unit: UnitRecord, position: int) -> None:
        key = unit.key
        try:
            async with self._key_lock(key):
                written = await self.actions.write_position(unit, position)
            self._unlock(key)
            if written is not None:
                self._assume(written)
            self.position_throttle.written(key, position, self.clock())
        except ApiError as error:
            log.debug("position of %s not written: %s", key, error)
        finally:
            self._busy.discard(key)

    async def _write_queue(self, view: QueueView, now: float) -> None:
        try:
            await self.queue_writer.write(view, self.store.queues.get(view.name), now)
        except ApiError as error:
            log.warning("status of Queue %s not written: %s", view.name, error)

    def _waiting_events(self, views: dict[str, QueueView], waiting: dict[str, list[Unit]]) -> None:
        if self.events is None:
            return
        depth = self.settings.waiting_event_depth
        for name, units in waiting.items():
            reason = views[name].reason if name in views else ""
            for index, unit in enumerate(units[:depth]):
                category = f"head:{reason}" if index == 0 else "behind"
                if self._waiting_said.get(unit.key) == category:
                    continue
                record = self.unit(unit.key)
                if record is None:
                    continue
                self._waiting_said[unit.key] = category
                message = (f"waiting in queue {name}: {reason}" if index == 0
                           else f"waiting in queue {name}: behind {index} units")
                self.events.unit_event(record, "Normal", "Waiting", message, on_unit=False)
        if self._waiting_said:
            still = {unit.key for units in waiting.values()
                     for unit in units[: self.settings.position_depth]}
            for key in [k for k in self._waiting_said if k not in still]:
                del self._waiting_said[key]

    async def run_status(self) -> None:
        """Publish status every half interval (each object is throttled itself)."""
        while True:
            try:
                await self.publish()
            except Exception:
                log.exception("status round failed")
            await asyncio.sleep(max(0.05, self.settings.status_interval / 2))

    # -- running ---------------------------------------------------------------------------
    async def run(self, on_cycle: Callable[[], None] | None = None) -> None:
        """Cycle whenever something changed, or a deadline is due; forever.
        Status is published alongside, from its own task."""
        self.start_listening()
        status = asyncio.get_running_loop().create_task(self.run_status())
        try:
            await self.resync(reindex=True)
            while True:
                if self.clock() >= self._next_resync:
                    await self.resync()  # the safety net: everything looked at again
                try:
                    self.cycle(self.settings.batch)
                except Exception:
                    # A bug must not stop admission for good: start over from the store.
                    log.exception("admission cycle failed; rebuilding from the cache")
                    self._all = True
                    await asyncio.sleep(1.0)
                if on_cycle is not None:
                    on_cycle()
                if self._consumers or self._units:
                    await asyncio.sleep(0)  # more to do: just let others run first
                else:
                    await self._sleep()
        finally:
            status.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await status
            self.stop_listening()
            await self.close()

    async def _sleep(self) -> None:
        """Until woken (then debounce) or until the next deadline."""
        if self._pending_work():
            self._wake.clear()
        else:
            timeout = None
            now = self.clock()
            deadline = min((self._timers[0][0] if self._timers else float("inf")),
                           self._next_resync)
            if deadline != float("inf"):
                timeout = max(0.0, deadline - now)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        if self.settings.debounce > 0:
            await asyncio.sleep(self.settings.debounce)
        else:
            await asyncio.sleep(0)

    def _pending_work(self) -> bool:
        return bool(self._units or self._consumers or self._all or self._queues_dirty
                    or self._capacity_dirty)

    async def settle(self, *, rounds: int = 100) -> None:
        """Run cycles until no write is in flight and nothing changed (tests)."""
        for _ in range(rounds):
            self.cycle()
            if not self._tasks and not self._pending_work():
                return
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            else:
                await asyncio.sleep(0)
        raise RuntimeError("the loop did not settle")

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
