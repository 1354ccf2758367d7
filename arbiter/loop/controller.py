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
retries). Writes whose result the watch has not delivered yet are kept in
`InFlightWrites` (`arbiter.loop.inflight`), shared with the reclaimer, so no
cycle acts on a stale unit; it owns every piece of in-flight state (its
lifecycle is drawn there): the loop reads it and calls its operations.
Status is published by `StatusPublisher` (`arbiter.loop.publisher`) from
its own task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from arbiter.base import metrics
from arbiter.base.aio import wait_event
from arbiter.base.kubeapi import ClusterApi
from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.records import JobRecord, PodRecord, UnitRecord
from arbiter.cache.store import ClusterStore, Kind
from arbiter.core.fastpath import FAST_PATH_ANNOTATION
from arbiter.core.model import Unit
from arbiter.loop.access import barred, barred_step
from arbiter.loop.actions import Actions
from arbiter.loop.checks import CheckStateGauge, check_deadline, check_step, checks_for
from arbiter.loop.consumers import Consumer
from arbiter.loop.events import EventSink
from arbiter.loop.fastpath import FastPath, Reservation
from arbiter.loop.follow import StoreFollower
from arbiter.loop.index import LoopIndex, consumer_state, consumer_uid
from arbiter.loop.inflight import InFlightWrites
from arbiter.loop.mirror import unqueued_pod
from arbiter.loop.placement import PodDirectives, directives_for
from arbiter.loop.publisher import StatusPublisher
from arbiter.loop.reclaim import LoopAccess, Reclaimer, ReclaimSettings
from arbiter.loop.settings import CycleStats, LoopSettings
from arbiter.loop.timeouts import admission_deadline, backoff_delay, record_due, release_deadline
from arbiter.loop.units import (
    DesiredUnit,
    Step,
    alternate_name,
    consumer_key,
    decide,
    follows_consumer,
    gate_workload,
    held,
    lets_pods_go,
    spec_drift,
    suspend_workload,
)
from arbiter.loop.workloads import record_of, to_let_go
from arbiter.loop.writer import UnitWriter

log = logging.getLogger(__name__)

# Consumers and units a webhook request may bring the engine up to date
# with before it asks the fast path (more: the held path; a request never
# waits on the loop's backlog).
FAST_CYCLE = 64


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
        follow: StoreFollower | None = None,
        fast_path_key: bytes | None = None,
    ) -> None:
        self.store = store
        self.settings = settings or LoopSettings()
        self.actions = Actions(api, identity=identity, directives=self._directives)
        self.events = events
        self.clock = clock
        self.rng = rng or random.Random()
        # The engine and what keeps it in step with the store (shared with
        # the debug view of replicas that do not lead); what the next cycle
        # must look at is the follower's. A warm one (a standby's, kept in
        # step while this replica did not lead) has every unit placed
        # already: admission starts at once (`run`).
        self.follow = follow or StoreFollower(store, self.settings.overcommit)
        self.warm = follow is not None and follow.indexed
        self.mirror = self.follow.mirror
        self.charges = self.follow.charges
        self.check_states = CheckStateGauge()
        self.stats = CycleStats()
        self._units = self.follow.units
        self._consumers = self.follow.consumers
        # Writes in flight and what they assume (shared with the reclaimer
        # and the status publisher); busy keys are unit keys and
        # "create:<consumer>" for a unit being created.
        self.writes = InFlightWrites(clock=clock, max_writes=self.settings.max_writes,
                                     retry_base=self.settings.retry_base,
                                     retry_max=self.settings.retry_max,
                                     on_assumed=self._assumed)
        self.writer = UnitWriter(
            self.actions, self.writes, self.stats, unit=self.unit, consumer=self.consumer,
            touch=self.touch, touch_consumer=self._touch_consumer,
            backoff_delay=self._backoff_delay, events=events, clock=clock,
            admitted_delay=self.settings.fast_unit_delay)
        self._blocked_names: set[str] = set()
        self._wake = asyncio.Event()
        self._next_resync = 0.0
        self._listening = False
        self.warming = True
        self.publisher = StatusPublisher(
            store, self.mirror, self.actions, self.writes, unit=self.unit, events=events,
            clock=clock, interval=self.settings.status_interval, qps=self.settings.status_qps,
            waiting_event_depth=self.settings.waiting_event_depth,
            position_depth=self.settings.position_depth)
        self.reclaimer = Reclaimer(ReclaimSettings(
            grace=self.settings.reclaim_grace, pdb_timeout=self.settings.reclaim_pdb_timeout),
            self.writes.evictions)
        self.publisher.reclaim_notes = lambda: self.reclaimer.notes
        if self.warm:
            # A takeover admits first; reclaim (a look over every admitted
            # unit, seconds at scale) waits one interval, so the first
            # admissions' writes are not held behind it.
            self.reclaimer.next_look = clock() + self.reclaimer.settings.interval
        self.fast = FastPath(store=store, mirror=lambda: self.mirror, writes=self.writes,
                             creating=self.writer.creating, known=self._in_engine,
                             key=fast_path_key if self.settings.admit_on_create else None,
                             identity=identity, clock=clock)
        self.reclaim_access = LoopAccess(
            writes=self.writes, actions=self.actions, unit=self.unit, consumer=self.consumer,
            touch=self.touch, events=events, clock=clock)

    # -- wiring ---------------------------------------------------------------------------
    def start_listening(self) -> None:
        if not self._listening:
            self.store.listeners.append(self.on_change)
            self._listening = True

    def stop_listening(self) -> None:
        if self._listening:
            self.store.listeners.remove(self.on_change)
            self._listening = False

    @property
    def index(self) -> LoopIndex:
        return self.follow.index

    def on_change(self, kind: Kind, key: str) -> None:
        """Store listener: note what changed (`StoreFollower.note`) and wake the loop."""
        if kind == "QueueUnit":
            self.check_states.update(key, self.store.units.get(key))
        elif kind == "Namespace" and key not in self.store.namespaces:
            self._consumers.update(self.writes.namespace_gone(key))
        if self.follow.note(kind, key):
            self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def touch(self, key: str) -> None:
        """Look at unit `key` again (a write on it ended) and wake the loop."""
        self._units.add(key)
        self._wake.set()

    def _touch_consumer(self, consumer: ConsumerKey) -> None:
        self._consumers.add(consumer)
        self._wake.set()

    def queued(self) -> int:
        """Consumers and units waiting for a cycle to look at them."""
        return len(self._consumers) + len(self._units)

    # -- views over store + in-flight writes ---------------------------------------------
    def unit(self, key: str) -> UnitRecord | None:
        """The unit as the loop should see it: our last write until the watch has it."""
        return self.writes.unit(key, self.store.units.get(key))

    def _assumed(self, record: UnitRecord) -> None:
        """A write's result is assumed: index a unit the store has not seen
        yet, and look at it again."""
        if record.key not in self.store.units:
            touched = self.index.on_unit(record.key, record)
            self._consumers.update(touched)
            self.charges.consumers(touched)
        self.touch(record.key)

    def _directives(self, unit: UnitRecord) -> PodDirectives:
        """What a released unit's pods are given: its pool's nodeSelector and
        tolerations, and its queue's nodeSelector."""
        consumer = unit.consumer
        job = self.store.jobs.get(f"{unit.namespace}/{consumer.name}") \
            if consumer is not None and consumer.kind == "Job" else None
        return directives_for(unit, self.store.pools, self.store.queues, job)

    def consumer(self, unit: UnitRecord) -> tuple[Consumer, tuple[PodRecord, ...]]:
        """What the unit's consumer is doing (with our unseen writes applied)."""
        key = consumer_key(unit)
        state, pods = consumer_state(self.store, self.index, unit, key)
        job = self.store.jobs.get(f"{key.namespace}/{key.name}") \
            if key is not None and key.kind == "Job" else None
        return self.writes.consumer(key, state, job.resource_version if job else ""), pods

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
        if self.follow.begin():  # everything queued: with the units we assume
            self._units.update(self.writes.assumed_keys())
            self._next_resync = now + self.settings.resync_interval
        for key in self.writes.due(now):
            consumers = self.writes.woken(key)
            if consumers is not None:
                self._consumers.update(consumers)  # creations to try again
            else:
                self._units.add(key)

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
        self.charges.flush(store, self.index, self.mirror, self.unit,
                           limit=self.settings.batch if budget is not None else None)

        if self.fast.reservations:  # room reserved for Jobs that never came is free again
            self.fast.expire(now, self._reserved_job,
                             lambda key: self.unit(key) is not None)
        chosen = [] if self.warming else self.mirror.admit_all()
        self._admit_chosen(chosen)
        if not self.warming:  # take back what others need
            self.reclaimer.after_cycle(self.mirror, now, self.reclaim_access)
            self.charges.set_leaving(self.mirror.nodes.leaving)
        duration = time.perf_counter() - started
        self.stats.cycles += 1
        self.stats.admitted += len(chosen)
        self.stats.last_duration = duration
        metrics.admission_cycle_duration_seconds.observe(duration)
        return chosen

    def _admit_chosen(self, chosen: list[Unit]) -> None:
        """Write the admissions the engine decided (assumed already)."""
        for unit in chosen:
            record = self.unit(unit.key)
            if record is None:  # cannot happen: only known units are pending
                self.mirror.set(unit.key, None, None)
                continue
            self.writer.admit(record, unit, self.mirror.plan(unit.key),
                              checks=checks_for(record, self.store.queues.get(record.queue)))

    # -- admission at creation (arbiter.loop.fastpath) ---------------------------------
    def admit_on_create(self, namespace: str, name: str, queue: str,
                        obj: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The webhook's question for a Job being created in `queue`: the
        JSON Patch ops that let it through admitted, or None (held; no later
        Job of its queue passes it while the engine has not seen it)."""
        parsed = self.fast.parse(namespace, name, queue, obj)
        ops = self._admit_on_create(obj, *parsed) if parsed is not None else None
        if ops is None:
            self.fast.held(namespace, name, queue, parsed[0] if parsed is not None else None)
        return ops

    def _admit_on_create(self, obj: dict[str, Any], desired: DesiredUnit,
                         job: JobRecord) -> list[dict[str, Any]] | None:
        if self.warming or not self.fast.eligible(desired, job):
            return None
        if self.unit(desired.key) is not None or self.mirror.state(desired.key) is not None \
                or desired.consumer in self.fast.reservations:
            return None
        if self.follow.everything or self.queued() > FAST_CYCLE:
            return None  # the loop is behind: its backlog is ahead, and no request waits on it
        if self.queued() or self.follow.pending():
            self.cycle(FAST_CYCLE)  # what the loop would do next: first
            if self.queued():
                return None
        if self.fast.creating_in(desired.queue) \
                or self.fast.blocked(desired.queue):
            return None
        others, reservation = self.fast.try_reserve(desired)
        self._admit_chosen(others)
        if reservation is None:
            return None
        self.stats.admitted += 1
        self._wake.set()
        return self.fast.patch(obj, desired, reservation, job)

    def _in_engine(self, consumer: ConsumerKey) -> bool:
        return any(self.mirror.state(key) is not None for key in self.index.units_for(consumer))

    def _reserved_job(self, consumer: ConsumerKey, reservation: Reservation) -> JobRecord | None:
        job = self.store.jobs.get(f"{consumer.namespace}/{consumer.name}")
        return job if job is not None and \
            dict(job.annotations).get(FAST_PATH_ANNOTATION) == reservation.token else None

    async def resync(self, *, reindex: bool = False, chunk: int = 1000) -> None:
        """Queue every consumer and unit for a look, in slices, yielding
        between them (a new leader with a large cache must not stall the
        webhook that shares this event loop). With `reindex`, rebuild the
        index first (`LoopIndex.fill`)."""
        await self.follow.resync(reindex=reindex, chunk=chunk)
        self._units.update(self.writes.assumed_keys())
        self._next_resync = self.clock() + self.settings.resync_interval

    def _reconcile_consumer(self, consumer: ConsumerKey, units: set[str]) -> None:
        existing = [u for u in map(self.unit, self.index.units_for(consumer)) if u is not None]
        units.update(u.key for u in existing)
        uid = consumer_uid(self.store, consumer)
        if uid is None or not self.store.is_managed_namespace(consumer.namespace):
            return
        # Only a unit naming this very consumer (its uid; "" for a pod
        # group) stands for it: a unit without the uid may be anyone's.
        mine = [u for u in existing if u.consumer is not None and u.consumer.uid == uid]
        if mine:
            self.fast.confirmed(consumer)  # a reservation at creation, if any, is done
            # A waiting unit's spec is its consumer's (a Job's parallelism
            # changed, or a tenant edited the unit): put it back; it is not
            # admitted meanwhile (`_drifted`).
            unit = mine[0]
            if self.writes.busy(unit.key) or self.writes.outdated(unit):
                return
            if follows_consumer(unit):
                wanted = self.follow.desired(consumer)
                drift = spec_drift(unit, wanted) if wanted is not None else None
                if drift is not None:
                    self.writer.update_spec(unit, drift)
            elif unit.admitted and (lets_pods_go(unit) or suspend_workload(unit)):
                # A workload resized while admitted (DESIGN §14): requeued at
                # its new size (scaled to 0: nothing left to admit); a
                # suspend-held one (a declared kind's counts, a RayCluster's
                # groups) is suspended again.
                wanted = self.follow.desired(consumer)
                # A finished one (a RayJob, a declared kind) is not resized:
                # its unit ends.
                record = record_of(self.store, consumer)
                finished = record is not None and record.outcome is not None
                gone = wanted is None and not finished and lets_pods_go(unit)
                if gone or (wanted is not None and wanted.pod_sets != unit.pod_sets):
                    self.writer.step(unit, Step("rehold", "Enqueued", (
                        "replicas changed while admitted; its pods are made again and wait "
                        "for the new size to be admitted") if gate_workload(unit) else (
                        "pod counts changed while admitted; suspended again and queued at "
                        "its new size")))
            return
        desired = self.follow.desired(consumer)
        if desired is None:
            return
        if self.unit(desired.key) is not None:
            # A namesake unit (a reservation, or the unit of a deleted
            # predecessor the garbage collector has not removed yet) is never
            # this consumer's: its own goes under a name of its own.
            desired = replace(desired, name=alternate_name(desired))
        if self.unit(desired.key) is not None:
            if desired.key not in self._blocked_names:
                self._blocked_names.add(desired.key)
                log.warning("cannot create QueueUnit %s for %s: the name is taken",
                            desired.key, consumer)
            return
        self._blocked_names.discard(desired.key)
        self.writer.create(desired, self._admitted_at_creation(consumer, desired))

    def _admitted_at_creation(self, consumer: ConsumerKey,
                              desired: DesiredUnit) -> tuple[dict[str, Any], str, float] | None:
        """A Job let through at creation gets its unit admitted (DESIGN §16)."""
        if consumer.kind != "Job":
            return None
        job = self.store.jobs.get(f"{consumer.namespace}/{consumer.name}")
        if job is None or (created := self.fast.created(job, desired)) is None:
            return None
        return (*created, job.created)

    def _reconcile_unit(self, key: str, now: float) -> None:
        unit = self.unit(key)
        if unqueued_pod(key) is not None:
            return  # a pod's unqueued usage (arbiter.loop.charges), not a unit
        self.charges.unit(key)
        if unit is None:
            if self.fast.reserved_key(key):
                return  # reserved at creation: its unit is not written yet
            self.mirror.set(key, None, None)
            self.writes.forget(key)
            return
        if not self.store.is_managed_namespace(unit.namespace):
            # Not arbiter's: not admitted nor charged, whatever its status
            # says (DESIGN §13).
            self.mirror.set(key, None, None)
            return
        outdated = self.writes.outdated(unit)
        consumer, pods = self.consumer(unit)
        writes = self.writes
        foreign = barred(self.store, unit)
        if not writes.admission_running(key):
            where = self.follow.where(unit, consumer, now)
            if where == "pending" and (outdated or self.writes.retry_at(key) > now):
                where = None  # wait for the watch, or for the retry time
            if unit.requeue_at is not None and unit.requeue_at > now:
                self.writes.timer(unit.requeue_at, key)  # sent back by a check: look again then
            self.follow.place(key, unit, where, pods)
        if unit.phase != "TimeoutBackoff":
            writes.end_backoff(key)
        elif writes.backoff_end(key) is None:
            # Found in backoff (a restart): wait the backoff out again from now.
            writes.back_off(key, now + self._backoff_delay(unit.attempts))
        if self.writes.busy(key) or outdated:
            return  # a write is running, or we know this version is outdated
        retry = self.writes.retry_at(key)
        if retry > now:
            # A refused release waits for its retry, but not past its
            # deadline: under load retries came minutes apart.
            unlet = release_deadline(unit, self.settings.admission_timeout) \
                if consumer is Consumer.HELD else None
            if unlet is None or now < unlet:
                self.writes.timer(retry if unlet is None else min(retry, unlet), key)
                return
        behind = self._spec_behind(unit)
        if behind is not None:
            # Its spec is not its consumer's and a write was busy when the
            # consumer was looked at: look again (that writes it back).
            self._consumers.add(behind)
        started = self._started(unit)
        barred_to = None if foreign is None else barred_step(unit, consumer, foreign)
        if barred_to is not None:
            step = barred_to
        elif unit.reserved and held(unit, consumer) in (Consumer.HELD, Consumer.NONE):
            step = check_step(unit, now, self.store.admission_checks)
            deadline = check_deadline(unit, self.store.admission_checks)
            if step.kind == "none" and deadline is not None:
                self.writes.timer(deadline, key)
        else:
            step = decide(unit, consumer, now=now, timeout=self.settings.admission_timeout,
                          backoff_until=writes.backoff_end(key), started=started,
                          record_within=self.settings.record_within)
        if step.kind == "none" and unit.admitted and lets_pods_go(unit) \
                and to_let_go(unit, pods):
            step = Step("release")  # a pod made after admission (OrderedReady: one by one)
        if step.kind == "none":
            deadline = record_due(unit, self.settings.record_within) if unit.unwritten \
                else admission_deadline(unit, self.settings.admission_timeout, started)
            if deadline is not None:
                self.writes.timer(deadline, key)
            backoff = writes.backoff_end(key)
            if backoff is not None:  # set above whenever the unit is in TimeoutBackoff
                self.writes.timer(backoff, key)
            return
        self.writer.step(unit, step)

    def _started(self, unit: UnitRecord) -> float:
        """When the Job controller took a Job unit's release up (0: not yet)."""
        if unit.consumer is None or unit.consumer.kind != "Job":
            return 0.0
        job = self.store.jobs.get(f"{unit.namespace}/{unit.consumer.name}")
        return job.start_time if job is not None and job.uid == unit.consumer.uid else 0.0

    def _spec_behind(self, unit: UnitRecord) -> ConsumerKey | None:
        """The consumer of a waiting unit whose spec is not what it asks."""
        key = consumer_key(unit)
        if key is None or unit.consumer is None or not follows_consumer(unit):
            return None
        wanted = self.follow.desired(key)
        behind = wanted is not None and wanted.consumer_uid == unit.consumer.uid \
            and spec_drift(unit, wanted) is not None
        return key if behind else None

    def _backoff_delay(self, attempts: int) -> float:
        return backoff_delay(attempts, base=self.settings.backoff_base,
                             cap=self.settings.backoff_max, jitter=self.rng.random())

    # -- running ---------------------------------------------------------------------------
    async def run(self, on_cycle: Callable[[], None] | None = None) -> None:
        """Cycle whenever something changed, or a deadline is due; forever.
        Status is published alongside, from its own task."""
        self.start_listening()
        status = asyncio.get_running_loop().create_task(self.publisher.run())
        try:
            if self.warm:
                # The engine has every unit already: admit, then look at each again.
                self.warming = False
                self.cycle(self.settings.batch)
                await self.resync()
            else:
                await self.resync(reindex=True)
            while True:
                if self.clock() >= self._next_resync:
                    await self.resync()  # the safety net: everything looked at again
                try:
                    self.cycle(self.settings.batch)
                except Exception:
                    # A bug must not stop admission for good: start over from the store.
                    log.exception("admission cycle failed; rebuilding from the cache")
                    self.follow.everything = True
                    await asyncio.sleep(1.0)
                if on_cycle is not None:
                    on_cycle()
                if self._consumers or self._units or self.charges.pending():
                    # More to do: let others run first.
                    await asyncio.sleep(self.settings.rest_after(self.stats.last_duration))
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
            deadline = min(self.writes.next_deadline(), self._next_resync)
            timeout = None if deadline == math.inf else max(0.0, deadline - self.clock())
            self._wake.clear()
            await wait_event(self._wake, timeout)
        rest = self.settings.rest_after(self.stats.last_duration)
        await asyncio.sleep(max(self.settings.debounce, rest))  # 0: just let others run

    def _pending_work(self) -> bool:
        return self.follow.pending()

    async def settle(self, *, rounds: int = 100) -> None:
        """Run cycles until no write is in flight and nothing changed (tests)."""
        for _ in range(rounds):
            self.cycle()
            if not self.writes.running() and not self._pending_work():
                return
            if self.writes.running():
                await self.writes.wait()
            else:
                await asyncio.sleep(0)
        raise RuntimeError("the loop did not settle")

    async def close(self) -> None:
        await self.writes.close()
