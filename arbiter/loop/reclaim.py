"""Reclaim in the admission loop: when to take resources back, from whom
(`arbiter.core.reclaim.flat.plan`), and carrying it out (`arbiter.loop.evict`).

After each cycle's admissions the controller calls `Reclaimer.after_cycle`
with a `LoopAccess` (the loop's in-flight writes and lookups, nothing more).
At most once per `interval` it looks at the engine:

- a queue is *starving* while the unit it offers next does not fit, is
  within its capability, and it is under its guarantee with it or some
  queue that could lose is richer (the move rule, `arbiter.core.reclaim.flat`);
  `since[q]` is when that began, and it is
  forgotten as soon as a look finds the queue not starving (a head that
  fits free room the cycle could not give it, a victim's pods still
  terminating, is not that: the clock runs on). Only a queue
  starving for `grace` seconds (`--reclaim-grace`) reclaims, so a short
  burst is absorbed by ordinary turnover. Within-queue preemption
  (`spec.preemption.withinQueue: LowerPriority`) needs no grace, like
  kube-scheduler's priority preemption.
- Victims are *in flight* from the moment they are chosen until the engine
  no longer counts them admitted (requeued, ended or gone) or they were
  admitted again (a later admission attempt). In-flight units are never
  chosen again, and their capacity counts as free already, so a shortfall
  is paid for once. From then until their pods are gone, those pods count
  on no node for admission either (`NodeModel.set_leaving`): the room is
  the taker's.
- A look that cannot serve a starving unit says why (`Plan.refused`, from
  `arbiter.core.reclaim.why`): `notes`, shown as the unit's message, and
  one `hold` decision log line per new reason. An eviction a PodDisruptionBudget blocks
  (429) is not in flight any more; the unit is left alone for a while
  (doubling, capped) and the next look decides afresh.
- The loop wakes itself (a timer) when a queue's grace runs out and, while
  evictions are in flight, for the next look.
- A look costs O(admitted units of the queues that could lose some) — about
  0.3 s at 100,000 of them (bench/bench_reclaim.py) — so looks are spaced
  to at least ten times what the last one took. A new leader starts with a
  fresh Reclaimer: grace periods are measured anew.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import Any

from arbiter.base import metrics
from arbiter.base.kubeapi import ApiError
from arbiter.cache.ownership import WORKLOAD_CONSUMERS
from arbiter.cache.records import PodRecord, UnitRecord
from arbiter.core.api import parse_rfc3339
from arbiter.core.engine.tree import has_hierarchy
from arbiter.core.model import Unit
from arbiter.core.reclaim.flat import (
    Admitted,
    Plan,
    ReclaimQueue,
    Victim,
    Waiting,
    floor_of,
    may_gain,
    plan,
    richest_share,
    within_capability,
)
from arbiter.core.reclaim.room import NodeRoom
from arbiter.core.resources import EMPTY, Resources
from arbiter.loop.actions import Actions, ConsumerGone
from arbiter.loop.consumers import Consumer
from arbiter.loop.decisions import Decision, log_decision
from arbiter.loop.events import EventSink
from arbiter.loop.evict import Evictor
from arbiter.loop.inflight import EVICTION_TTL, Evictions, InFlightWrites
from arbiter.loop.mirror import EngineMirror, unqueued_pod
from arbiter.loop.units import consumer_key, gate_workload

log = logging.getLogger(__name__)

# The timer key that wakes the loop for reclaim (not a unit: a cycle that
# finds no such unit does nothing with it).
WAKE_KEY = "reclaim:"
RECLAIM_REASON = "ReclaimedByQueue"
PREEMPT_REASON = "PreemptedByArbiter"


@dataclass(frozen=True, slots=True)
class ReclaimSettings:
    grace: float = 30.0
    interval: float = 1.0  # seconds between two looks at least
    cost_factor: float = 10.0  # ... and at least this many times what the last one took
    max_victims: int = 100  # per look
    depth: int = 256  # waiting units per queue a look considers
    candidates: int = 4096  # admitted units a look considers (the first in victim order)
    # Seconds a look may compute before it stops (the next look goes on):
    # it runs on the event loop, which also renews the leader's Lease.
    budget: float = 1.0
    # Seconds a unit's evictions may be blocked by PodDisruptionBudgets
    # before its pods are deleted instead (arbiter.loop.evict); negative: never.
    pdb_timeout: float = 300.0


@dataclass(frozen=True, slots=True)
class LoopAccess:
    """What taking units back needs of the admission loop, and no more: the
    loop's in-flight writes (victims are written like the loop's own units),
    its API client, a view of units and consumers with those writes applied,
    and a way to have a unit looked at again. The reclaimer never reaches
    into the controller."""

    writes: InFlightWrites
    actions: Actions
    unit: Callable[[str], UnitRecord | None]
    consumer: Callable[[UnitRecord], tuple[Consumer, tuple[PodRecord, ...]]]
    touch: Callable[[str], None]  # look at this unit again (and wake the loop)
    events: EventSink | None
    clock: Callable[[], float]


@dataclass(slots=True)
class Look:
    """What one look decided (for the controller, and for tests)."""

    plan: Plan = field(default_factory=Plan)
    victims: list[Victim] = field(default_factory=list)
    wake_at: float | None = None
    looked: bool = False
    queues: dict[str, ReclaimQueue] = field(default_factory=dict)


def reclaim_queues(mirror: EngineMirror) -> dict[str, ReclaimQueue]:
    """Every known queue with its deserved share, as status computes it."""
    shares = mirror.deserved()
    return {
        name: ReclaimQueue(
            name=name, weight=record.weight, guarantee=record.guarantee,
            capability=record.capability, deserved=shares.get(name, EMPTY),
            priority=record.priority, reclaimable=record.reclaimable,
            within_queue=record.within_queue, parent=record.parent,
            child_order=record.child_order,
        )
        for name, record in mirror.queues.items()
    }


def message_for(victim: Victim, queues: dict[str, ReclaimQueue] | None = None) -> str:
    """Why a unit was taken back, for its status, Events and its pods."""
    unit = victim.unit
    if victim.reason == "withinQueue":
        return (f"preempted in queue {unit.queue} by higher-priority unit {victim.for_unit} "
                f"(priority {unit.priority} is lower; withinQueue: LowerPriority)")
    why = (f"queue {victim.for_queue} is below its guarantee" if victim.guarantee else
           f"queue {unit.queue}'s weighted share, even without this unit, is above queue "
           f"{victim.for_queue}'s")
    return f"reclaimed by queue {victim.for_queue} for unit {victim.for_unit}: {why}"


def _first(item: tuple[Any, ...]) -> Any:
    return item[0]


class Reclaimer:
    def __init__(self, settings: ReclaimSettings | None = None,
                 evictions: Evictions | None = None) -> None:
        self.settings = settings or ReclaimSettings()
        self.since: dict[str, float] = {}
        # The victims in flight, draining or blocked: the loop's
        # (`InFlightWrites.evictions`); a reclaimer alone keeps its own.
        self.evictions = evictions if evictions is not None else Evictions()
        self.next_look = -math.inf
        self._stamps: dict[str, tuple[str | None, float]] = {}
        self.last: Look = Look()
        # Why a starving unit is not reclaiming (`Plan.refused`), as of the
        # last look: its QueueUnit message says so (`StatusPublisher`).
        self.notes: dict[str, str] = {}
        # Units looks out of time found no room for (`Plan.passed`): the
        # next looks go on past them, until one gets through every queue.
        self.skip: dict[str, bool] = {}

    # -- deciding (no I/O) ------------------------------------------------------------
    def forget_done(self, mirror: EngineMirror, now: float,
                    record: Callable[[str], UnitRecord | None] = lambda _: None) -> None:
        """Drop in-flight victims the engine no longer counts admitted, or
        admitted again since (`record`: the unit as the loop has it): a
        victim admitted again holds room and counts for its queue, as it
        does in the engine, so it is no longer room being freed."""
        def readmitted(key: str, attempt: int | None) -> bool:
            found = record(key)
            return attempt is not None and (found is None or found.attempts != attempt)

        self.evictions.expire(now, admitted=lambda k: mirror.state(k) == "admitted",
                              readmitted=readmitted,
                              on_nodes=lambda k: bool(mirror.nodes.uncovered_pods(k)))

    def look(
        self,
        mirror: EngineMirror,
        now: float,
        *,
        busy: Set[str] = frozenset(),
        record: Callable[[str], UnitRecord | None] = lambda _: None,
    ) -> Look:
        """Decide what to take back now (registers the victims as in flight);
        the victims' pods stop counting on their nodes for admission."""
        result = self._look(mirror, now, busy, record)
        mirror.nodes.set_leaving(self.evictions.leaving())
        mirror.nodes.expire_stale(now, EVICTION_TTL)
        if result.looked:
            notes = {k: v for k, v in self.notes.items() if k in self.skip}
            notes.update(result.plan.refused)
            self._note(notes, record)
            if result.plan.timed_out:
                self.skip.update(result.plan.passed)
            else:
                self.skip.clear()
        return result

    def _note(self, notes: dict[str, str], record: Callable[[str], UnitRecord | None]) -> None:
        """Keep why units are not reclaiming; log each new reason once."""
        for key, note in notes.items():
            found = record(key)
            if self.notes.get(key) != note and found is not None:
                log_decision("hold", found, note, cause="reclaim")
        self.notes = notes

    def _look(self, mirror: EngineMirror, now: float, busy: Set[str],
              record: Callable[[str], UnitRecord | None]) -> Look:
        self.forget_done(mirror, now, record)
        result = Look()
        if now < self.next_look:
            # Something changed since the last look (a cycle ran): look again soon.
            result.wake_at = self.next_look
            self.last = result
            return result
        self.next_look = now + self.settings.interval
        started = time.perf_counter()
        result.looked = True
        engine = mirror.engine
        waiting_queues = [name for name, record_ in mirror.queues.items()
                          if record_.state == "Open" and mirror.waiting.get(name)]
        if not waiting_queues:
            self.since.clear()
            self.last = result
            return result
        queues = result.queues = reclaim_queues(mirror)
        free = engine.free()
        # Which queues could need victims at all (cheap: heads only).
        interesting = False
        heads: dict[str, list[Waiting]] = {}
        fitting: set[str] = set()  # queues whose head fits the free capacity
        richest = richest_share(queues, engine.allocated, engine.capacity())
        # In a tree a parent's capability may hold a head back, and shares
        # are compared per level: the pass itself tells (heads only: cheap).
        tree = has_hierarchy(queues.values())
        units: dict[str, Unit] = {}  # the waiting units below, by key (their pod sets)
        room = self._node_room(mirror, units)
        for name in waiting_queues:
            pending = engine.pending(name)[: self.settings.depth]
            if not pending:
                continue
            heads[name] = [Waiting(u.key, u.queue, u.demand, u.priority) for u in pending]
            units.update((u.key, u) for u in pending)
            head = pending[0]
            spec = queues[name]
            held = engine.allocated(name)
            fits = head.demand.fits_in(free) and within_capability(
                held, head.demand, spec.capability) and (room is None or room.fits(heads[name][0]))
            if fits:
                fitting.add(name)
            if self.evictions.taking() or tree or (not fits and (
                    spec.within_queue == "LowerPriority"
                    or may_gain(spec, held, head.demand, engine.capacity(), richest))):
                interesting = True
        if not interesting:
            # A head that fits here was not admitted by the cycle just run:
            # its room is not usable yet (a victim's pods still terminating,
            # node fit). The queue is not fed; forgetting its clock would
            # make it wait a whole new grace for what it is still owed.
            for name in [q for q in self.since if q not in fitting]:
                del self.since[name]
            self.last = result
            return result
        protected = set(busy) | self.evictions.held_back(now)
        # What each queue holds, evictions in flight taken off (their room
        # counts as free already).
        holding: dict[str, Resources] = {name: engine.allocated(name) for name in queues}
        for flight in self.evictions.taking().values():
            gone = flight.victim.unit
            if gone.queue in holding:
                holding[gone.queue] = holding[gone.queue] - gone.demand
        # Candidates: units of reclaimable queues above their floor in some
        # resource, and of queues that preempt inside; the first
        # `candidates` of them in victim order.
        sources = {name for name, spec in queues.items()
                   if (spec.reclaimable and not holding[name].fits_in(floor_of(spec)))
                   or (spec.within_queue == "LowerPriority" and name in heads)}
        keyed: list[tuple[tuple[int, int, float, float, str], Unit, float]] = []
        stamps, fresh = self._stamps, {}
        inflight = self.evictions.taking()
        for key, (state, unit) in mirror.entries.items():
            if state != "admitted" or unit.queue not in sources or key in inflight \
                    or key in protected:
                continue
            found = record(key)
            stamp = found.last_allocate_time if found is not None else None
            cached = stamps.get(key)
            when = cached[1] if cached is not None and cached[0] == stamp else (
                parse_rfc3339(stamp) or unit.created)
            fresh[key] = (stamp, when)
            keyed.append(((queues[unit.queue].priority, unit.priority, -when, -unit.created,
                           key), unit, when))
        self._stamps = fresh
        keyed.sort(key=_first)
        admitted = [Admitted(order[4], unit.queue, unit.demand, unit.priority, when,
                             unit.created)
                    for order, unit, when in keyed[: self.settings.candidates]]
        # No grace: every queue is due, those starving for the first time too
        # (else they would wait for the next look while others take first).
        due = set(queues) if self.settings.grace <= 0 else {
            q for q, since in self.since.items() if now - since >= self.settings.grace}
        budget_ends = started + self.settings.budget
        decided = plan(engine.capacity(), queues, admitted, heads, due=due,
                       allocated=holding, ordered=True, max_victims=self.settings.max_victims,
                       room=room, out_of_time=lambda: time.perf_counter() > budget_ends,
                       skip=self.skip)
        cut = decided.cut or len(decided.victims) >= self.settings.max_victims
        for name in decided.starving:
            self.since.setdefault(name, now)
        if not cut:
            for name in [q for q in self.since if q not in decided.starving]:
                del self.since[name]
        for victim in decided.victims:
            found = record(victim.unit.key)
            self.evictions.begin(victim, now, found.attempts if found is not None else None)
        result.plan = decided
        result.victims = list(decided.victims)
        # A look over very many units is not cheap: space them out so that
        # they take at most 1/cost_factor of the loop's time.
        took = time.perf_counter() - started
        self.next_look = now + max(self.settings.interval, self.settings.cost_factor * took)
        wake = [since + self.settings.grace for q, since in self.since.items() if q not in due]
        if self.evictions.taking() or cut:
            wake.append(self.next_look)
        result.wake_at = min(wake) if wake else None
        self.last = result
        return result

    def _node_room(self, mirror: EngineMirror, units: dict[str, Unit]) -> NodeRoom | None:
        """Node fit for a look (None without nodes): victims' room being
        freed counts as free on their nodes, as it does in total (the pods
        of victims no longer admitted count nowhere already: `set_leaving`)."""
        view = mirror.engine.node_view() if mirror.nodes.enabled else None
        if view is None:
            return None
        leaving = [pod for key in self.evictions.taking() for pod in view.held(key)]
        return NodeRoom(view, units, mirror.engine.capacity(), leaving)

    # -- acting (through the loop's in-flight writes) ---------------------------------
    def after_cycle(self, mirror: EngineMirror, now: float, loop: LoopAccess) -> list[Victim]:
        """The loop's hook: look, start the evictions, set the wake-up."""
        writes = loop.writes
        result = self.look(mirror, now, busy=writes.busy_keys(), record=loop.unit)
        for victim in result.victims:
            writes.spawn(functools.partial(
                carry_out, loop, self, victim, message_for(victim, result.queues)),
                key=victim.unit.key)
        if result.wake_at is not None:
            writes.timer(result.wake_at, WAKE_KEY)
        return result.victims


async def carry_out(loop: LoopAccess, reclaimer: Reclaimer, victim: Victim,
                    message: str) -> None:
    """Take one unit back, as one of the loop's writes."""
    key = victim.unit.key
    evictor = Evictor(loop.actions.api, loop.actions)
    try:
        pod = unqueued_pod(key)
        if pod is not None:
            await _evict_unqueued(loop, reclaimer, evictor, victim, pod, message)
            return
        async with loop.writes.locked(key):
            record = loop.unit(key)
            if record is None or (not record.admitted and not record.reserved
                                  and record.phase != "Enqueued"):
                reclaimer.evictions.abandon(key)
                return
            state, pods = loop.consumer(record)
            consumer = record.consumer
            if consumer is None or consumer.kind == "Job" or (
                    consumer.kind in WORKLOAD_CONSUMERS and not gate_workload(record)):
                await _requeue(loop, reclaimer, evictor, victim, record, state, message)
            else:
                await _evict(loop, reclaimer, evictor, victim, record, pods, message)
    except ApiError as error:
        reclaimer.evictions.abandon(key)
        log.warning("taking back %s failed: %s", key, error)
    finally:
        loop.touch(key)


def _announce(loop: LoopAccess, victim: Victim, record: UnitRecord, message: str,
              decision: Decision) -> None:
    log_decision(decision, record, message, level=logging.WARNING, cause=victim.reason,
                 for_queue=victim.for_queue, for_unit=victim.for_unit)
    metrics.preempted_units_total.labels(record.queue, victim.reason).inc()
    events = loop.events
    if events is None:
        return
    reason = RECLAIM_REASON if victim.reason == "reclaim" else PREEMPT_REASON
    events.unit_event(record, "Warning", reason, message)
    waiting = loop.unit(victim.for_unit)
    if waiting is not None:
        what = ("reclaiming" if victim.reason == "reclaim" else "preempting")
        events.unit_event(waiting, "Normal", "Reclaiming" if victim.reason == "reclaim"
                          else "Preempting",
                          f"{what} {record.key} of queue {record.queue} to make room "
                          f"for this unit", on_unit=True)


async def _requeue(loop: LoopAccess, reclaimer: Reclaimer, evictor: Evictor,
                   victim: Victim, record: UnitRecord, state: Consumer, message: str) -> None:
    """A Job (or a reservation): back to Enqueued, then suspended."""
    key = record.key
    text = f"{message}; requeued"
    # Written even when Enqueued already (a Job let go outside arbiter): the
    # write's guard proves the version decided on is current. A stale one
    # (the watch behind an admission on record) is not taken back.
    written = await evictor.requeue(record, text)
    if written is None:
        reclaimer.evictions.abandon(key)  # changed meanwhile: decide again
        return
    loop.writes.assume(written.record)
    record = written.record
    _announce(loop, victim, record, text, "requeue")
    consumer = consumer_key(record)
    if consumer is None:
        return  # a reservation: the status was the whole admission
    try:
        version = await evictor.suspend_job(record)
    except ConsumerGone:
        loop.writes.override(consumer, Consumer.MISSING, state)
        return
    if state in (Consumer.RELEASED, Consumer.RUNNING):
        loop.writes.override(consumer, Consumer.HELD, state, version)


async def _evict(loop: LoopAccess, reclaimer: Reclaimer, evictor: Evictor,
                 victim: Victim, record: UnitRecord, pods: tuple[PodRecord, ...],
                 message: str) -> None:
    """A plain pod or a pod group: the Eviction API, pod by pod."""
    targets = [p for p in pods if p.phase not in ("Succeeded", "Failed")]
    now = loop.clock()
    blocked: list[str] = []
    evicted: list[PodRecord] = []
    since = reclaimer.evictions.first_blocked(record.key)
    overdue = _pdb_overdue(reclaimer, since, now)
    forced: list[str] = []
    for pod in targets:
        outcome = await evictor.evict_pod(pod.namespace, pod.name, pod.uid)
        if outcome == "blocked" and overdue:
            forced.append(pod.name)
            outcome = await evictor.delete_pod(pod.namespace, pod.name, pod.uid)
        if outcome == "blocked":
            blocked.append(pod.name)
        elif outcome == "evicted":
            evicted.append(pod)
    reason = RECLAIM_REASON if victim.reason == "reclaim" else PREEMPT_REASON
    for pod in evicted:
        await evictor.mark_disruption(pod.namespace, pod.name, pod.uid, reason, message, now)
    if forced and loop.events is not None:
        loop.events.unit_event(
            record, "Warning", "PodDisruptionBudgetOverridden",
            f"{message}; pod(s) {', '.join(forced)} deleted: a PodDisruptionBudget blocked "
            f"their eviction for {now - (since or now):.0f}s (--reclaim-pdb-timeout)")
    if blocked:
        delay = _blocked(loop, reclaimer, record.key, now)
        if loop.events is not None:
            loop.events.unit_event(
                record, "Warning", "EvictionBlocked",
                f"{message}; eviction of pod(s) {', '.join(blocked)} blocked by a "
                f"PodDisruptionBudget, retrying in {delay:.0f}s")
        return
    if gate_workload(record):
        # Serving (DESIGN §14): its controller makes the pods again, gated,
        # and they wait for the unit's next admission; nothing failed.
        written = await evictor.requeue(record, f"{message}; evicted and requeued")
    else:
        written = await evictor.end(record, f"{message}; evicted")
    if written is not None:
        loop.writes.assume(written.record)
        record = written.record
    _announce(loop, victim, record, f"{message}; evicted", "evict")


async def _evict_unqueued(loop: LoopAccess, reclaimer: Reclaimer, evictor: Evictor,
                          victim: Victim, pod: tuple[str, str, str], message: str) -> None:
    """Unqueued usage (`arbiter.loop.charges`): a pod no admitted unit
    covers has no unit to requeue; the pod itself is evicted, under the same
    PodDisruptionBudget timeout as a unit's pods."""
    namespace, name, uid = pod
    now = loop.clock()
    key = victim.unit.key
    since = reclaimer.evictions.first_blocked(key)
    outcome = await evictor.evict_pod(namespace, name, uid)
    forced = outcome == "blocked" and _pdb_overdue(reclaimer, since, now)
    if forced:
        outcome = await evictor.delete_pod(namespace, name, uid)
    if outcome == "blocked":
        _blocked(loop, reclaimer, key, now)
        return
    reason = RECLAIM_REASON if victim.reason == "reclaim" else PREEMPT_REASON
    if outcome == "evicted":
        how = (f"deleted: a PodDisruptionBudget blocked its eviction for "
               f"{now - (since or now):.0f}s (--reclaim-pdb-timeout)") if forced else "evicted"
        await evictor.mark_disruption(namespace, name, uid, reason, f"{message}; {how}", now)
        metrics.preempted_units_total.labels(victim.unit.queue, victim.reason).inc()
        log.warning("%s unqueued pod %s/%s of queue %s: %s", how, namespace, name,
                    victim.unit.queue, message)


def _pdb_overdue(reclaimer: Reclaimer, since: float | None, now: float) -> bool:
    """A PodDisruptionBudget has blocked taking this back for the whole
    `--reclaim-pdb-timeout` (negative: never overdue)."""
    timeout = reclaimer.settings.pdb_timeout
    return since is not None and timeout >= 0 and now - since >= timeout


def _blocked(loop: LoopAccess, reclaimer: Reclaimer, key: str, now: float) -> float:
    """Back off from `key` and look again when the backoff ends (nothing else
    may wake the loop); returns the delay."""
    delay = reclaimer.evictions.block(key, now)
    loop.writes.timer(now + delay, WAKE_KEY)
    return delay
