"""The writes a cycle decides for a unit, carried out as the loop's
in-flight writes (`arbiter.loop.inflight`): create a unit, bring its spec
up to date, admit it (status first, then release its consumer), or take
the step `units.decide` picked (a phase, release, hold, backoff).

Each write assumes its result (so the next cycle sees it before the watch
does), marks its unit for another look when it ends, and on an API error is
retried after a backoff. A write refused because the unit changed under it
marks that version outdated: the loop decides again on the newer one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from arbiter.base import metrics
from arbiter.base.kubeapi import ApiError
from arbiter.cache import convert
from arbiter.cache.ownership import POD_KINDS, ConsumerKey
from arbiter.cache.records import PodRecord, UnitAdmission, UnitRecord
from arbiter.core.api import UnitPhase
from arbiter.core.model import Placement, Unit
from arbiter.loop.actions import WAITING_PHASES, Actions, ConsumerGone, Written, in_phase
from arbiter.loop.checks import checked_status, rejected_status, requeued_status
from arbiter.loop.consumers import Consumer
from arbiter.loop.decisions import log_decision, remember
from arbiter.loop.events import EventSink
from arbiter.loop.fastpath import Creations, record_admitted
from arbiter.loop.inflight import TERMINATING_HOLD, InFlightWrites
from arbiter.loop.units import DesiredUnit, Step, consumer_key, group_members

log = logging.getLogger(__name__)


# The cause the apiserver gives when it refuses new objects in a namespace
# being deleted (NamespaceLifecycle admission, 403; a StatusCause's type is
# serialised as "reason").
NAMESPACE_TERMINATING = "NamespaceTerminating"
# Units created admitted kept with what their creation returned, until their
# status is written (`LoopSettings.record_within` at the creation rate; a
# bound, not a cache: past it, the write reads the unit first).
CREATED_KEPT = 2_000


def namespace_terminating(error: ApiError) -> bool:
    """The apiserver refused a creation because its namespace is being deleted."""
    details = error.body.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return error.status == 403 and isinstance(causes, list) and any(
        isinstance(cause, dict) and cause.get("reason") == NAMESPACE_TERMINATING
        for cause in causes)


class WriteCounts(Protocol):
    """Where the writes count what they did (the controller's `CycleStats`)."""

    created: int
    writes_failed: int


def partial_replicas(unit: UnitRecord, chosen: Unit) -> dict[str, int] | None:
    """Pods per pod set the engine admitted, when fewer than the unit asks
    (partial admission, DESIGN §12); None when it admitted them all."""
    admitted = {ps.name: ps.count for ps in chosen.pods}
    if all(admitted.get(ps.name, ps.count) == ps.count for ps in unit.pod_sets):
        return None
    return {ps.name: admitted.get(ps.name, ps.count) for ps in unit.pod_sets}


def releases_early(unit: UnitRecord, replicas: dict[str, int] | None,
                   checks: tuple[str, ...]) -> bool:
    """Whether the unit's Job is let go with its status write: a Job's first
    admission, whole, with no admission checks (its status is then its
    whole record: a re-admission reads the earlier ones first)."""
    return unit.consumer is not None and unit.consumer.kind == "Job" and not replicas \
        and not checks and unit.admissions == 0


def with_plan(unit: UnitRecord, plan: Placement | None) -> UnitRecord:
    """The unit as its admission status will say, for its release's directives."""
    return replace(unit, admission=UnitAdmission.from_placement(plan)
                   if plan is not None else None)


class UnitWriter:
    def __init__(
        self,
        actions: Actions,
        writes: InFlightWrites,
        stats: WriteCounts,
        *,
        unit: Callable[[str], UnitRecord | None],
        consumer: Callable[[UnitRecord], tuple[Consumer, tuple[PodRecord, ...]]],
        touch: Callable[[str], None],
        touch_consumer: Callable[[ConsumerKey], None],
        backoff_delay: Callable[[int], float],
        events: EventSink | None,
        clock: Callable[[], float],
        admitted_delay: float = 0.0,
    ) -> None:
        self.actions = actions
        self.writes = writes
        self.stats = stats
        self.unit = unit
        self.consumer = consumer
        self.touch = touch
        self.touch_consumer = touch_consumer
        self.backoff_delay = backoff_delay
        self.events = events
        self.clock = clock
        self.admitted_delay = admitted_delay
        # Creations running of units that will wait: not in the engine yet,
        # and perhaps ahead of a Job being created.
        self.creating = Creations()
        # Units created admitted whose status is not written yet: the record
        # and (merged) status their creation returned, so the write that
        # puts the admission into the status needs no read first.
        self.created_admitted: dict[str, tuple[UnitRecord, Mapping[str, Any]]] = {}

    # -- starting writes (from a cycle) -------------------------------------------------
    def create(self, desired: DesiredUnit,
               admitted: tuple[dict[str, Any], str, float] | None = None) -> None:
        """Create the unit, unless a creation for its consumer is running or
        waits for its retry. `admitted`: (status, why, Job created) of a Job
        let through at creation: the unit is created admitted (DESIGN §16)."""
        busy = f"create:{desired.consumer}"
        if self.writes.busy(busy) or self.writes.retry_at(busy) > self.clock():
            return
        if self.writes.held_in(desired.namespace, desired.consumer):
            # Refused there already: one request per namespace, not one
            # (retried, backed off) per Job while it is being emptied.
            return
        if admitted is None:
            self.creating.start(desired.consumer, desired.queue)
        self.writes.spawn(functools.partial(self._create, busy, desired, admitted), key=busy)

    def update_spec(self, unit: UnitRecord, spec: dict[str, Any]) -> None:
        self.writes.spawn(functools.partial(self._update_spec, unit, spec), key=unit.key)

    def admit(self, unit: UnitRecord, chosen: Unit, plan: Placement | None = None, *,
              checks: tuple[str, ...] = ()) -> None:
        """Admit `unit` as the engine chose it (`chosen.pods` may hold fewer
        pods than asked: partial admission); with `checks`, only reserve its
        quota until they pass (arbiter.loop.checks)."""
        self.writes.admission_started(unit.key)
        # A group's pods as of now (this cycle's store): only they are admitted.
        members = group_members(unit, self.consumer(unit)[1]) \
            if unit.consumer is not None and unit.consumer.kind == "PodGroup" else ()
        self.writes.spawn(functools.partial(self._admit, unit, chosen, plan, checks, members),
                          key=unit.key)

    def step(self, unit: UnitRecord, step: Step) -> None:
        self.writes.spawn(functools.partial(self._step, unit, step), key=unit.key)

    def _failed(self, key: str, error: BaseException) -> None:
        """A write failed: retry the key later (a "create:" key wakes its consumer)."""
        self.writes.failed(key, error)
        self.stats.writes_failed += 1

    # -- the writes (tasks) ------------------------------------------------------------
    async def _create(self, busy: str, desired: DesiredUnit,
                      admitted: tuple[dict[str, Any], str, float] | None) -> None:
        try:
            if admitted is not None and self.admitted_delay > 0:
                await asyncio.sleep(self.admitted_delay)
            written = await self.actions.create_unit(
                desired, admitted[0] if admitted is not None else None)
            if written is not None:
                self.writes.assume(written.record)
                self.stats.created += 1
                if admitted is not None:
                    self._admitted_at_creation(written.record, admitted[1], admitted[2])
                    self._keep_created(written)
            self.writes.succeeded(busy)
        except ApiError as error:
            if namespace_terminating(error):
                self.writes.succeeded(busy)
                if self.writes.hold_namespace(desired.namespace, desired.consumer):
                    log.info("namespace %s is being deleted: no QueueUnits created there "
                             "until it is gone (or %gs)", desired.namespace, TERMINATING_HOLD)
                return
            self.writes.retry_creation(busy, desired.consumer)
            self._failed(busy, error)
        finally:
            self.creating.end(desired.consumer)
            self.touch_consumer(desired.consumer)

    def _admitted_at_creation(self, record: UnitRecord, why: str, created: float) -> None:
        record_admitted(record, why, created)
        if self.events is not None:
            self.events.unit_event(record, "Normal", "Admitted",
                                   f"admitted by queue {record.queue} at creation "
                                   "(fast path: never suspended)", on_unit=False)

    async def _update_spec(self, unit: UnitRecord, spec: dict[str, Any]) -> None:
        try:
            written = await self.actions.update_spec(unit, spec)
            if written is None:
                self.writes.conflicted(unit)
            else:
                self.writes.assume(written.record)
        except ApiError as error:
            self._failed(unit.key, error)
        finally:
            self.touch(unit.key)

    async def _admit(self, unit: UnitRecord, chosen: Unit, plan: Placement | None,
                     checks: tuple[str, ...] = (), members: tuple[str, ...] = ()) -> None:
        """Status first (the admission record), then release the consumer
        (not yet when the unit waits on admission checks). A Job admitted
        whole for the first time is let go together with the status write,
        not after it (DESIGN §16): the extender places its pods on either
        record, and a crash between the two leaves a released Job the next
        leader counts as admitted, or an admitted unit whose release it
        finishes."""
        key = unit.key
        admitted = False
        replicas = partial_replicas(unit, chosen)
        early = asyncio.ensure_future(self._release(with_plan(unit, plan))) \
            if releases_early(unit, replicas, checks) else None
        decided = unit
        try:
            async with self.writes.locked(key):
                # A position write may have run meanwhile: start from its result.
                unit = self.unit(key) or unit
                # Or a newer version came that no longer waits (the watch
                # caught up after the decision): that version is current,
                # not outdated; the decision was.
                moot = unit.resource_version != decided.resource_version \
                    and unit.phase not in WAITING_PHASES
                now = self.clock()
                written = None if moot and early is None else await self.actions.admit(
                    unit, now, plan, checks=checks, replicas=replicas, members=members)
                if written is None and early is not None:
                    # Its Job is let go already: the admission is recorded
                    # all the same (else it runs with no admission on record).
                    written = await self.actions.admit(unit, now, plan,
                                                       let_go=("Dequeued", ""))
            if written is None:
                log.info("admission of %s not recorded: the unit changed under it", key)
                # Decide again on the newer version. Marking the version the
                # store has as outdated when it is the current one would
                # leave the unit undecided until something else changed it.
                self.writes.conflicted(decided if moot else unit)
                return
            admitted = True
            self.writes.assume(written.record)
            self.writes.succeeded(key)
            if replicas:
                metrics.partial_admissions_total.labels(unit.queue).inc()
            if written.record.reserved:
                log_decision("reserve", written.record, "quota reserved; waiting on "
                             f"admission checks {', '.join(checks)}",
                             attempt=written.record.attempts)
                if self.events is not None:
                    self.events.unit_event(written.record, "Normal", "QuotaReserved",
                                           written.record.message, on_unit=False)
                return
            log_decision("admit", written.record, "next in fair-share order and fits",
                         attempt=written.record.attempts, path="held")
            metrics.admitted_units_total.labels(unit.queue).inc()
            if unit.admissions == 0 and chosen.created:
                metrics.admission_wait_seconds.labels(unit.queue).observe(
                    max(0.0, now - chosen.created))
            if self.events is not None:
                # On the Job or pod (where users look); on the unit only when
                # it has none: its status says it already, and every Event
                # is an apiserver write competing with admissions.
                self.events.unit_event(written.record, "Normal", "Admitted",
                                       f"admitted by queue {unit.queue} (held until now)",
                                       on_unit=False)
            if early is None:
                await self._release(written.record)
        except ApiError as error:
            if not admitted:
                self._failed(key, error)
        finally:
            if early is not None:
                await early  # its own errors are handled in _release
            self.writes.admission_ended(key)
            self.touch(key)

    async def _release(self, unit: UnitRecord) -> None:
        key = consumer_key(unit)
        state, pods = self.consumer(unit)
        try:
            await self.actions.release(unit, pods)
        except ConsumerGone as error:
            # Gone (the watch will say so): do not try again meanwhile.
            log.info("not releasing %s: %s", unit.key, error)
            if key is not None:
                self.writes.override(key, Consumer.MISSING, state)
            return
        except ApiError as error:
            self._failed(unit.key, error)
            return
        if key is not None and state is Consumer.HELD:
            self.writes.override(key, Consumer.RELEASED, Consumer.HELD)
            what = unit.consumer.kind if unit.consumer is not None else "work"
            remember("release", unit, f"{what} let go (unsuspended or ungated)")

    async def _step(self, unit: UnitRecord, step: Step) -> None:
        key = unit.key
        try:
            if step.kind == "release":
                await self._release(unit)
            elif step.kind == "hold":
                if step.message:
                    log_decision("hold", unit, step.message, level=logging.WARNING)
                await self._hold(unit)
            elif step.kind == "rehold":
                # A serving workload resized while admitted: requeued at its
                # new size, its pods made again gated.
                written = await self._set_phase(unit, "Enqueued", step.message)
                if written is not None:
                    log_decision("requeue", written.record, step.message)
                    await self._hold(written.record)
            elif step.kind == "adopt" and step.phase is not None:
                await self._adopt(unit, step.phase, step.message)
            elif step.kind == "phase" and step.phase is not None:
                written = await self._set_phase(unit, step.phase, step.message)
                if written is not None and step.phase == "Enqueued":
                    log_decision("requeue", written.record, step.message)
            elif step.kind == "record":
                await self._record(unit, step.phase, step.message)
            elif step.kind in ("checked", "requeue", "reject"):
                await self._checks_done(unit, step)
            elif step.kind == "backoff":
                written = await self._set_phase(unit, "TimeoutBackoff", step.message)
                if written is not None:
                    delay = self.backoff_delay(written.record.attempts)
                    self.writes.back_off(key, self.clock() + delay)
                    log_decision("backoff", written.record, step.message, level=logging.WARNING,
                                 attempt=written.record.attempts, retry_in=round(delay, 1))
                    if self.events is not None:
                        self.events.unit_event(
                            written.record, "Warning", "Backoff",
                            f"{step.message}; next try in {delay:.0f}s "
                            f"(attempt {written.record.attempts})")
                    await self._hold(written.record)
        except ApiError as error:
            self._failed(key, error)
        finally:
            self.touch(key)

    async def _checks_done(self, unit: UnitRecord, step: Step) -> None:
        """A Reserved unit's checks decided: admit it for real (and release
        it), requeue it with its quota freed, or fail it (DESIGN §12)."""
        now = self.clock()
        if step.kind == "checked":
            status = checked_status(step.message, now)
        elif step.kind == "requeue":
            status = requeued_status(step.message, now, step.delay)
        else:
            status = rejected_status(step.message, now)
        written = self._landed(unit, await self.actions.write_status(
            unit, lambda _, __: status, in_phase("Reserved")))
        if written is None:
            return
        record = written.record
        if step.kind == "checked":
            log_decision("admit", record, step.message, attempt=record.attempts)
            metrics.admitted_units_total.labels(unit.queue).inc()
            if self.events is not None:
                self.events.unit_event(record, "Normal", "Admitted", step.message,
                                       on_unit=False)
            await self._release(record)
            return
        if step.kind == "requeue":
            log_decision("requeue", record, step.message, retry_in=step.delay)
        else:
            log_decision("reject", record, step.message, level=logging.WARNING)
        if self.events is not None:
            self.events.unit_event(
                record, "Warning",
                "AdmissionCheckRetry" if step.kind == "requeue" else "AdmissionCheckRejected",
                step.message)

    def _keep_created(self, created: Written) -> None:
        """Keep what the creation of a unit created admitted returned, for
        the write of its status (`units.record_step`: when its Job ends, or
        `LoopSettings.record_within` after its creation).
        Kept until then; at most `CREATED_KEPT` (a unit gone before its
        write, its consumer deleted, is dropped with the oldest)."""
        while len(self.created_admitted) >= CREATED_KEPT:
            del self.created_admitted[next(iter(self.created_admitted))]
        self.created_admitted[created.record.key] = (
            created.record, convert.unit_status(created.raw))

    async def _record(self, unit: UnitRecord, phase: UnitPhase | None = None,
                      message: str = "") -> None:
        """A unit created admitted gets its admission into its status, with
        `phase` when its consumer reached one (one write for both). From
        what its creation returned; else the unit is read first."""
        async with self.writes.locked(unit.key):
            kept = self.created_admitted.pop(unit.key, None)
            if not (self.unit(unit.key) or unit).unwritten:
                return  # written meanwhile
            fresh = kept if kept is not None and kept[0].uid == unit.uid else None
            written = await self.actions.write_recorded(unit, fresh, phase, message)
        self._landed(unit, written)

    async def _adopt(self, unit: UnitRecord, phase: UnitPhase, message: str) -> None:
        """A waiting unit whose consumer runs (let go outside arbiter, or by
        an admission whose status write did not land): counted as admitted
        from now, with an admission on record like any other."""
        plan = unit.admission.placement() if unit.admission is not None else None
        written = self._landed(unit, await self.actions.admit(unit, self.clock(), plan,
                                                               let_go=(phase, message)))
        if written is None:
            return
        log_decision("admit", written.record, message, attempt=written.record.attempts,
                     path="let go")
        metrics.admitted_units_total.labels(unit.queue).inc()

    async def _set_phase(self, unit: UnitRecord, phase: UnitPhase, message: str) -> Written | None:
        return self._landed(unit, await self.actions.set_phase(unit, phase, message))

    def _landed(self, unit: UnitRecord, written: Written | None) -> Written | None:
        """A status write's outcome: assumed when it landed, else `unit`'s
        version is outdated (decide again on the newer one)."""
        if written is None:
            self.writes.conflicted(unit)
            return None
        self.writes.assume(written.record)
        self.writes.succeeded(unit.key)
        return written

    async def _hold(self, unit: UnitRecord) -> None:
        key = consumer_key(unit)
        state, pods = self.consumer(unit)
        try:
            version = await self.actions.hold(unit, pods)
        except ConsumerGone:
            if key is not None:
                self.writes.override(key, Consumer.MISSING, state)
            return
        self.writes.succeeded(unit.key)
        if key is not None and key.kind not in POD_KINDS \
                and state in (Consumer.RELEASED, Consumer.RUNNING):
            # A Job or workload is held again (a plain pod's gate cannot come back).
            self.writes.override(key, Consumer.HELD, state, version)
