"""Admission at creation (DESIGN §16): the leader's webhook asks the engine
whether a new Job would be admitted as the next decision, and if so
reserves it and lets it through unsuspended and placed.

The decision is the cycle's own: the engine is first brought up to date
(a short cycle over what changed, as the loop would run a few milliseconds
later), then the Job's unit is added pending and `admit_all` runs. Every
unit it picks is admitted as a cycle would admit it (others' admissions
are written by the loop as usual); the Job goes through unsuspended only
when its unit is among them. Nothing else is ever passed over: what the
engine picks is what the next cycle would have picked (the property test
in tests/loop/test_fastpath_property.py).

Not taken (the held path as before): a replica that does not lead, the
loop warming up, a dry run, a Job with `generateName` (its unit's name is
not known yet), created suspended, partially admissible, of a child of a
held workload, whose queue has admission checks, whose name is taken; and
while a Job this webhook held (or whose unit is being created) is not in
the engine yet: it came first.

A reservation stands in the engine as admitted until the Job's unit is
created (admitted, in one write: `Actions.create_unit`; its status is
written once, with the phase its Job reached, when the Job ends or a
minute after, from what that write carried: `units.record_step`); one
whose Job never
appears (another webhook denied it, the client went away) is let go after
`ASSUME_TTL`, one whose Job finished before its unit was written at once.
A Job let through by an earlier leader whose unit was not written is
adopted from its token (arbiter.core.fastpath): admitted from the moment
it is seen.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from arbiter.base import metrics
from arbiter.cache import convert
from arbiter.cache.fastpath import job_demand, job_token
from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.records import JobRecord, UnitRecord
from arbiter.cache.store import ClusterStore
from arbiter.core.fastpath import FAST_PATH_ANNOTATION, TOKEN_TTL, FastPathToken, sign
from arbiter.core.model import Placement, Unit
from arbiter.loop.admitted import admission_status
from arbiter.loop.decisions import log_decision
from arbiter.loop.inflight import ASSUME_TTL, InFlightWrites
from arbiter.loop.mirror import EngineMirror, desired_engine_unit
from arbiter.loop.placement import placed_ops, pool_directives
from arbiter.loop.units import DesiredUnit, job_unit, manifest

log = logging.getLogger(__name__)

Op = dict[str, Any]
# Seconds a Job this webhook held may take to reach the engine (its watch
# event, its unit's creation) before the fast path stops counting it.
HELD_UNSEEN_TTL = ASSUME_TTL
NAMELESS_TTL = 2.0


@dataclass(frozen=True, slots=True)
class Reservation:
    unit_key: str
    queue: str
    plan: Placement | None
    token: str  # the annotation's value
    since: float


class Creations:
    """Units being created that will wait (the writer's creations), and per
    queue how many of them the fast path does not count pending already
    (not of a Job its webhook held): kept as counts, so the webhook's
    question costs the same whatever is being created."""

    def __init__(self) -> None:
        self._queue: dict[ConsumerKey, str] = {}  # consumer -> its unit's queue
        self._counted: set[ConsumerKey] = set()  # held by the webhook, counted pending
        self._uncounted: dict[str, int] = {}  # queue -> creations not counted

    def start(self, consumer: ConsumerKey, queue: str) -> None:
        self._queue[consumer] = queue
        if consumer not in self._counted:
            self._add(queue, 1)

    def end(self, consumer: ConsumerKey) -> None:
        queue = self._queue.pop(consumer, None)
        if queue is not None and consumer not in self._counted:
            self._add(queue, -1)

    def count(self, consumer: ConsumerKey, counted: bool) -> None:
        """The fast path counts `consumer`'s unit pending now, or no longer."""
        if counted == (consumer in self._counted):
            return
        if counted:
            self._counted.add(consumer)
        else:
            self._counted.discard(consumer)
        queue = self._queue.get(consumer)
        if queue is not None:
            self._add(queue, -1 if counted else 1)

    def uncounted(self, queue: str) -> bool:
        return self._uncounted.get(queue, 0) > 0

    def __len__(self) -> int:
        return len(self._queue)

    def _add(self, queue: str, by: int) -> None:
        count = self._uncounted.get(queue, 0) + by
        if count > 0:
            self._uncounted[queue] = count
        else:
            self._uncounted.pop(queue, None)


class FastPath:
    """The leader's reservations made at creation, and the Jobs its webhook
    held that the engine has not seen yet."""

    def __init__(self, *, store: ClusterStore, mirror: Callable[[], EngineMirror],
                 writes: InFlightWrites, creating: Creations, key: bytes | None,
                 identity: str, clock: Callable[[], float],
                 known: Callable[[ConsumerKey], bool] = lambda _: False) -> None:
        self.store = store
        self.mirror = mirror
        self.writes = writes
        self.creating = creating  # the writer's, live
        self.key = key
        self.identity = identity
        self.clock = clock
        self.known = known  # whether a consumer's unit is in the engine
        self.reservations: dict[ConsumerKey, Reservation] = {}
        # Jobs held, not in the engine yet -> (queue, until, their unit), and
        # when each is let go (in that order: one TTL).
        self._held: dict[ConsumerKey, tuple[str, float, Unit]] = {}
        self._until: deque[tuple[float, ConsumerKey]] = deque()
        # Per queue: until when each Job held whose unit is not known (no
        # name yet: generateName) keeps it off the fast path.
        self._nameless: dict[str, deque[float]] = {}
        self._expired: dict[str, float] = {}  # tokens of reservations expired -> when

    # -- the webhook's question ---------------------------------------------------------
    def held(self, namespace: str, name: str, queue: str, desired: DesiredUnit | None) -> None:
        """The webhook held a Job of `queue`: until its unit is in the
        engine, the fast path decides as if it were (`desired`: its unit,
        pending), so no later Job passes it. One whose unit is not known (no
        name yet: generateName) keeps its queue off the fast path a while."""
        now = self.clock()
        self._expire_held(now)  # here too: what is kept stays bounded by the TTLs
        if desired is None or not name:
            self._nameless_waiting(queue, now)  # drop the expired ones first
            self._nameless.setdefault(queue, deque()).append(now + NAMELESS_TTL)
            return
        consumer = ConsumerKey("Job", namespace, name)
        until = now + HELD_UNSEEN_TTL
        self._held[consumer] = (queue, until, desired_engine_unit(desired, now))
        self._until.append((until, consumer))
        self.creating.count(consumer, True)

    def _forget(self, consumer: ConsumerKey) -> None:
        if self._held.pop(consumer, None) is not None:
            self.creating.count(consumer, False)

    def _expire_held(self, now: float) -> None:
        while self._until and self._until[0][0] < now:
            until, consumer = self._until.popleft()
            entry = self._held.get(consumer)
            if entry is not None and entry[1] == until:  # not held again since
                self._forget(consumer)

    def blocked(self, queue: str) -> bool:
        """Whether `queue` waits for a Job held earlier whose unit is not known."""
        return self._nameless_waiting(queue, self.clock())

    def _nameless_waiting(self, queue: str, now: float) -> bool:
        """Whether Jobs held without a name still keep `queue` off the fast
        path; forgets those whose time is up."""
        waiting = self._nameless.get(queue)
        while waiting and waiting[0] < now:
            waiting.popleft()
        if waiting is not None and not waiting:
            del self._nameless[queue]
        return bool(waiting)

    def creating_in(self, queue: str) -> bool:
        """A unit of `queue` that will wait is being created for a consumer
        the fast path does not count pending already (not one this webhook
        held): it is not in the engine yet, and may be ahead."""
        self._expire_held(self.clock())
        return self.creating.uncounted(queue)

    def parse(self, namespace: str, name: str, queue_name: str,
              obj: dict[str, Any]) -> tuple[DesiredUnit, JobRecord] | None:
        """The unit a Job being created would have, and the Job as the cache
        will read it; None without a name or a unit."""
        if self.key is None or not name:
            return None
        try:
            job = convert.job_from_api(obj)
        except convert.ConversionError:
            return None
        job = replace(job, namespace=namespace, name=name, uid="", queue=queue_name)
        desired = job_unit(job, self.store.priority_classes, self.store.runtime_classes)
        return None if desired is None else (desired, job)

    def eligible(self, desired: DesiredUnit, job: JobRecord) -> bool:
        """Whether the fast path may take the Job at all."""
        if job.suspended or job.owner_kind or desired.key in self.store.units \
                or f"{desired.namespace}/{job.name}" in self.store.jobs \
                or any(ps.min_count is not None for ps in desired.pod_sets):
            return False
        queue = self.store.queues.get(desired.queue)
        return queue is not None and queue.state == "Open" and not queue.admission_checks \
            and self.store.queue_admits(desired.queue, desired.namespace)

    def try_reserve(self, desired: DesiredUnit) -> tuple[list[Unit], Reservation | None]:
        """Add the unit pending, with the Jobs held earlier whose units the
        engine has not seen yet, and let the engine decide as a cycle
        would: the units it admitted besides these (the caller writes
        them), and the reservation when it admitted this one. The held
        Jobs' units are taken out again: their own cycle admits them."""
        mirror = self.mirror()
        now = self.clock()
        self._expire_held(now)
        unit = desired_engine_unit(desired, now)
        ahead = []
        for consumer, (_, _, held) in list(self._held.items()):
            if self.known(consumer):
                self._forget(consumer)  # in the engine now: counted there
            elif mirror.state(held.key) is None and held.key != unit.key:
                ahead.append(held)
        for pending in (*ahead, unit):
            mirror.set(pending.key, "pending", pending)
        chosen = mirror.admit_all()
        for pending in ahead:
            mirror.set(pending.key, None, None)
        simulated = {u.key for u in ahead}
        others = [u for u in chosen if u.key != unit.key and u.key not in simulated]
        if all(u.key != unit.key for u in chosen):
            mirror.set(unit.key, None, None)
            return others, None
        reservation = Reservation(unit.key, desired.queue, mirror.plan(unit.key), "", now)
        self.reservations[desired.consumer] = reservation
        self.writes.timer(now + ASSUME_TTL + 0.5, unit.key)  # to expire, if the Job never comes
        return others, reservation

    def patch(self, obj: dict[str, Any], desired: DesiredUnit, reservation: Reservation,
              job: JobRecord) -> list[Op]:
        """JSON Patch ops that let the Job through admitted: the token, and
        the pool's directives in its pod template (as a release gives them)."""
        pool = reservation.plan.pool if reservation.plan is not None else ""
        token = FastPathToken(desired.name, desired.queue, pool, int(reservation.since * 1000))
        assert self.key is not None
        text = sign(self.key, desired.namespace, desired.consumer.name, token, job_demand(job))
        self.reservations[desired.consumer] = replace(reservation, token=text)
        meta: dict[str, Any] = obj.get("metadata") or {}
        found = meta.get("annotations")
        annotations: dict[str, Any] = found if isinstance(found, dict) else {}
        ops: list[Op] = []
        if annotations:
            ops.append({"op": "add", "value": text,
                        "path": "/metadata/annotations/" + FAST_PATH_ANNOTATION.replace("/", "~1")})
        else:
            ops.append({"op": "add", "path": "/metadata/annotations",
                        "value": {FAST_PATH_ANNOTATION: text}})
        seen = {**obj, "metadata": {**meta, "annotations": {**annotations,
                                                            FAST_PATH_ANNOTATION: text}}}
        directives = pool_directives(pool or None, desired.queue, self.store.pools,
                                     self.store.queues)
        # Without the guards a write to a stored object carries (uid, version).
        return ops + [op for op in placed_ops(seen, ("/spec/template",), directives, [])
                      if op["op"] != "test"]

    # -- the loop's side ----------------------------------------------------------------
    def created(self, job: JobRecord, desired: DesiredUnit) -> tuple[dict[str, Any], str] | None:
        """For a Job with no unit: the status its unit is created with
        (admitted) and why, when it was let through at creation: its
        reservation here, or (an earlier leader's) its token. None: the
        held path."""
        if job.suspended:
            return None
        token = job_token(self.key, job)
        if token is None or token.unit != desired.name or token.queue != desired.queue:
            return None
        reservation = self.reservations.get(desired.consumer)
        text = dict(job.annotations).get(FAST_PATH_ANNOTATION)
        now = self.clock()
        if reservation is not None and reservation.token == text:
            plan, why, since = reservation.plan, "admitted at creation (fast path)", \
                reservation.since
        else:
            # Seen only after its reservation expired (a lagging watch), or
            # let through by an earlier leader: it runs, so it is charged
            # from now, in its pool.
            plan, since = Placement(token.pool) if token.pool else None, now
            why = ("admitted at creation (fast path); seen after its reservation expired"
                   if text in self._expired
                   else "adopted: let through at creation by an earlier leader")
        record = convert.unit_from_api(manifest(desired))
        return admission_status(record, None, since, self.identity, plan), why

    def confirmed(self, consumer: ConsumerKey) -> None:
        """The Job's unit exists now: the reservation is done."""
        self.reservations.pop(consumer, None)

    def reserved_key(self, key: str) -> bool:
        return any(r.unit_key == key for r in self.reservations.values())

    def expire(self, now: float, job: Callable[[ConsumerKey, Reservation], JobRecord | None],
               written: Callable[[str], bool]) -> None:
        """Let go of reservations whose Job never came, or finished before
        its unit was written (a finished Job needs no unit: its room is
        free). `job`: the Job in the store with its token, its unit perhaps
        being created; `written`: its unit exists, and the engine has it as
        that unit."""
        mirror = self.mirror()
        for token, when in list(self._expired.items()):
            if now - when > TOKEN_TTL + ASSUME_TTL:
                del self._expired[token]  # its Job can no longer be created
        for consumer, reservation in list(self.reservations.items()):
            came = job(consumer, reservation)
            finished = came is not None and came.outcome is not None
            if not finished and (now - reservation.since <= ASSUME_TTL or came is not None):
                continue
            del self.reservations[consumer]
            self._expired[reservation.token] = now
            if written(reservation.unit_key):
                continue
            mirror.set(reservation.unit_key, None, None)
            why = "its Job finished before its unit was written" if finished \
                else f"its Job was not seen within {ASSUME_TTL:g}s"
            log.info("reservation at creation of %s let go: %s", reservation.unit_key, why,
                     extra={"unit": reservation.unit_key, "queue": reservation.queue})


def record_admitted(record: UnitRecord, why: str, created: float) -> None:
    """Log and count an admission at creation (its unit just written)."""
    log_decision("admit", record, why, attempt=record.attempts, path="creation")
    metrics.admitted_units_total.labels(record.queue).inc()
    if created:
        metrics.admission_wait_seconds.labels(record.queue).observe(
            max(0.0, time.time() - created))
