"""The one place that turns the loop's decisions into API writes.

Order matters for crash safety: an admission first records itself in the
QueueUnit's status (phase `Dequeued`, one more `admissions` entry), written
with the resourceVersion the decision was based on, and only then lets the
consumer go (Job `suspend: false`, pod gate removed). A unit whose status
says Dequeued is never admitted again, so a crash anywhere leaves either an
Enqueued unit (decided again later) or a Dequeued one whose release the next
leader finishes. A unit with admission checks is first `Reserved` (quota
held, nothing released; arbiter.loop.checks) and becomes Dequeued when its
checks pass. Going back is the mirror image: status first
(`TimeoutBackoff`), then the Job is suspended again.

Every write carries a precondition: status writes the resourceVersion,
consumer writes a JSON Patch `test` on the uid (a namesake that replaced the
consumer is never touched) and, for gates, on the gate itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from arbiter.base.kubeapi import (
    AlreadyExists,
    ApiError,
    ClusterApi,
    Conflict,
    Denied,
    Invalid,
    NotFound,
    Obj,
    job_path,
    pod_path,
    unit_path,
)
from arbiter.cache import convert
from arbiter.cache.ownership import WORKLOAD_CONSUMERS
from arbiter.cache.records import PodRecord, UnitRecord
from arbiter.core.api import (
    ADMISSION_GATE,
    ADMITTED_STATUS_ANNOTATION,
    UnitPhase,
)
from arbiter.core.model import Placement
from arbiter.integrations import BY_KIND
from arbiter.integrations.base import pointer
from arbiter.loop.admitted import admission_status
from arbiter.loop.placement import (
    NOTHING,
    PodDirectives,
    job_release_ops,
    placed_ops,
    pod_release_ops,
)
from arbiter.loop.units import DesiredUnit, manifest
from arbiter.loop.workloads import to_let_go

log = logging.getLogger(__name__)
T = TypeVar("T")


class ConsumerGone(Exception):
    """The consumer no longer exists (or is a namesake with another uid)."""


@dataclass(frozen=True, slots=True)
class Written:
    """A unit as the apiserver returned it after a write."""

    record: UnitRecord
    raw: Obj


def parallelism_ops(spec: Mapping[str, Any], count: int) -> list[dict[str, Any]]:
    """JSON Patch setting a suspended Job's parallelism to `count`, and its
    completions too when they were equal (an Indexed Job's, the only kind
    whose completions may change, together with parallelism)."""
    ops: list[dict[str, Any]] = []
    if spec.get("parallelism") is not None:  # the read the count was decided on
        ops.append({"op": "test", "path": "/spec/parallelism", "value": spec["parallelism"]})
    ops.append({"op": "add", "path": "/spec/parallelism", "value": count})
    if spec.get("completions") is not None \
            and spec.get("completions") == spec.get("parallelism") \
            and spec.get("completionMode") == "Indexed":
        ops.append({"op": "add", "path": "/spec/completions", "value": count})
    return ops


# The phases of a unit waiting for admission (`Reserved`: until its quota
# is reserved for its admission checks, `UnitRecord.reserved`).
WAITING_PHASES: tuple[UnitPhase, ...] = ("Enqueued", "Reserved")


def still_waiting(expected: UnitRecord) -> Callable[[UnitRecord], bool]:
    """Precondition of an admission retried after a conflict: the fresh unit
    is still waiting, in the same queue, asking for the same."""

    def check(fresh: UnitRecord) -> bool:
        return (
            fresh.phase in WAITING_PHASES and not fresh.reserved
            and fresh.queue == expected.queue
            and fresh.demand == expected.demand
        )

    return check


def waiting_in(expected: UnitRecord) -> Callable[[UnitRecord], bool]:
    """Precondition of recording the admission of a unit whose consumer was
    let go already: whatever else changed, it still waits in its queue."""

    def check(fresh: UnitRecord) -> bool:
        return fresh.phase in WAITING_PHASES and fresh.queue == expected.queue

    return check


def in_phase(phase: UnitPhase) -> Callable[[UnitRecord], bool]:
    def check(fresh: UnitRecord) -> bool:
        return fresh.phase == phase

    return check


class Actions:
    """API writes of the admission loop; retries are bounded and local."""

    def __init__(
        self,
        api: ClusterApi,
        *,
        conflict_retries: int = 3,
        release_retries: int = 5,
        retry_delay: float = 0.2,
        identity: str = "",
        directives: Callable[[UnitRecord], PodDirectives] | None = None,
    ) -> None:
        self.api = api
        self.identity = identity
        # What a released unit's pods are given (arbiter.loop.placement).
        self.directives = directives or (lambda _: NOTHING)
        self.conflict_retries = conflict_retries
        self.release_retries = release_retries
        self.retry_delay = retry_delay

    # -- QueueUnit objects -----------------------------------------------------------
    async def create_unit(self, desired: DesiredUnit,
                          admitted: Mapping[str, Any] | None = None) -> Written | None:
        """Create the unit; None if it exists already (the watch brings it).
        `admitted`: the status of its admission at creation (the fast path,
        DESIGN §16), recorded with the object in one write (a status cannot
        be written on create: `convert.unit_status` reads it from there)."""
        obj = manifest(desired)
        if admitted is not None:
            obj["metadata"]["annotations"] = {
                ADMITTED_STATUS_ANNOTATION: orjson.dumps(dict(admitted)).decode()}
        try:
            obj = await self.api.create(unit_path(desired.namespace), obj)
        except AlreadyExists:
            return None
        return Written(convert.unit_from_api(obj), obj)

    async def update_spec(self, unit: UnitRecord, spec: Mapping[str, Any]) -> Written | None:
        """Bring a waiting unit's spec in line with its consumer (rv-guarded)."""
        patch = {"metadata": {"resourceVersion": unit.resource_version}, "spec": dict(spec)}
        try:
            obj = await self.api.merge_patch(unit_path(unit.namespace, unit.name), patch)
        except (Conflict, NotFound):
            return None  # decided again once the watch has the newer version
        return Written(convert.unit_from_api(obj), obj)

    async def write_status(
        self,
        unit: UnitRecord,
        build: Callable[[UnitRecord, Mapping[str, Any] | None], Mapping[str, Any]],
        expect: Callable[[UnitRecord], bool],
        *,
        current: Mapping[str, Any] | None = None,
    ) -> Written | None:
        """Merge-patch the unit's status under its resourceVersion.

        `build(record, current_status)` makes the status from the unit the
        write is based on; on a conflict the unit is read again and, while
        `expect(fresh)` holds, the write is rebuilt and retried. None when
        the unit is gone or no longer what the decision assumed.
        """
        record = unit
        path = unit_path(unit.namespace, unit.name, status=True)
        if unit.unwritten and current is None:
            # Created admitted, its admission still in the annotation (the
            # fast path): this write must carry it into the status, or a
            # field the write clears (`allocated`) would come back from it.
            try:
                fresh = await self.api.get(unit_path(unit.namespace, unit.name))
            except NotFound:
                return None
            record, current = convert.unit_from_api(fresh), convert.unit_status(fresh)
            if not expect(record):
                return None
        for _ in range(self.conflict_retries + 1):
            status = dict(build(record, current))
            if record.unwritten:
                status = {**(current or {}), **status}
            patch = {
                "metadata": {"resourceVersion": record.resource_version},
                "status": status,
            }
            try:
                obj = await self.api.merge_patch(path, patch)
                return Written(convert.unit_from_api(obj), obj)
            except NotFound:
                return None
            except Conflict:
                try:
                    fresh = await self.api.get(unit_path(unit.namespace, unit.name))
                except NotFound:
                    return None
                record = convert.unit_from_api(fresh)
                current = convert.unit_status(fresh)
                if not expect(record):
                    return None
        return None

    async def write_recorded(self, unit: UnitRecord,
                             fresh: tuple[UnitRecord, Mapping[str, Any]] | None = None,
                             phase: UnitPhase | None = None, message: str = "",
                             ) -> Written | None:
        """Write the admission a unit created admitted carries in its
        `arbiter.dev/admitted-status` annotation into its status (the fast
        path, DESIGN §16), and `phase` (`message`) when its consumer reached
        one: `write_status` carries the annotation over. `fresh`: the unit
        as its creation returned it (record, merged status); else
        `write_status` reads it. None when the unit is gone, another one,
        or written already."""

        def expect(r: UnitRecord) -> bool:
            return r.unwritten and r.uid == unit.uid

        def build(_: UnitRecord, __: Mapping[str, Any] | None) -> dict[str, Any]:
            return {} if phase is None else {"phase": phase, "message": message}

        if fresh is None:
            return await self.write_status(unit, build, expect)
        record, status = fresh
        if not expect(record):
            return None
        return await self.write_status(record, build, expect, current=status)

    async def admit(self, unit: UnitRecord, now: float, plan: Placement | None = None, *,
                    checks: Sequence[str] = (),
                    replicas: Mapping[str, int] | None = None,
                    members: Sequence[str] = (),
                    let_go: tuple[UnitPhase, str] | None = None) -> Written | None:
        """Record the admission in the unit's status (phase Dequeued).

        A unit admitted before (TimeoutBackoff → Enqueued) is read first, so
        its earlier admissions are kept; None if the unit changed under us.
        `let_go`: (phase, message or "") of a unit whose consumer runs already
        (released with a status write that did not land, or outside
        arbiter): its admission is recorded whatever else changed, while it
        still waits in its queue, so every unit charged as admitted has one.
        """
        expect = waiting_in(unit) if let_go is not None else still_waiting(unit)
        current: Mapping[str, Any] | None = None
        record = unit
        if unit.admissions > 0:
            try:
                fresh = await self.api.get(unit_path(unit.namespace, unit.name))
            except NotFound:
                return None
            record = convert.unit_from_api(fresh)
            if not expect(record):
                return None
            current = convert.unit_status(fresh)

        def build(r: UnitRecord, cur: Mapping[str, Any] | None) -> dict[str, Any]:
            status = admission_status(r, cur, now, self.identity, plan, checks=checks,
                                      replicas=replicas, members=members)
            if let_go is not None:
                status["phase"] = let_go[0]
                status["message"] = let_go[1] or status["message"]
            return status

        return await self.write_status(record, build, expect, current=current)

    async def set_phase(self, unit: UnitRecord, phase: UnitPhase, message: str) -> Written | None:
        """A plain phase transition, guarded by the phase it starts from."""

        def build(_: UnitRecord, __: Mapping[str, Any] | None) -> dict[str, Any]:
            return {"phase": phase, "message": message}

        return await self.write_status(unit, build, in_phase(unit.phase))

    async def write_position(self, unit: UnitRecord, position: int | None,
                             message: str | None = None) -> Written | None:
        """Also states the phase: a new unit has none until then (a status
        cannot be set on create), and `kubectl get qu` should say Enqueued.
        `message`: why it waits, when that is worth saying (node fit)."""

        def build(_: UnitRecord, __: Mapping[str, Any] | None) -> dict[str, Any]:
            status: dict[str, Any] = {"position": position, "phase": unit.phase}
            if message is not None:
                status["message"] = message
            return status

        return await self.write_status(unit, build, in_phase(unit.phase))

    # -- consumers ----------------------------------------------------------------------
    async def _with_retries(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Retry a consumer write the webhook denied (its cache may lag ours);
        the write's result."""
        delay = self.retry_delay
        attempt = 0
        while True:
            try:
                return await call()
            except Denied as error:
                if attempt == self.release_retries:
                    raise
                log.info("%s denied (%s); retrying in %.1fs", what, error.message, delay)
                await asyncio.sleep(delay)
                delay *= 2
                attempt += 1

    async def set_job_suspend(self, namespace: str, name: str, uid: str, suspend: bool) -> str:
        """The Job's resourceVersion after the write ("" when not known)."""
        ops: list[dict[str, Any]] = []
        if uid:
            ops.append({"op": "test", "path": "/metadata/uid", "value": uid})
        ops.append({"op": "add", "path": "/spec/suspend", "value": suspend})

        async def call() -> str:
            try:
                job = await self.api.json_patch(job_path(namespace, name), ops)
            except (NotFound, Invalid) as error:
                raise ConsumerGone(f"Job {namespace}/{name}: {error}") from error
            meta = job.get("metadata") if isinstance(job, dict) else None
            return str((meta or {}).get("resourceVersion") or "")

        verb = "suspend" if suspend else "unsuspend"
        return await self._with_retries(f"{verb} Job {namespace}/{name}", call)

    async def remove_gate(self, namespace: str, name: str, uid: str) -> bool:
        """Remove arbiter's scheduling gate; False if it was not there."""
        path = pod_path(namespace, name)
        index = 0
        for _ in range(3):
            ops: list[dict[str, Any]] = []
            if uid:
                ops.append({"op": "test", "path": "/metadata/uid", "value": uid})
            ops += [
                {"op": "test", "path": f"/spec/schedulingGates/{index}/name",
                 "value": ADMISSION_GATE},
                {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
            ]
            try:
                await self.api.json_patch(path, ops)
                return True
            except NotFound as error:
                raise ConsumerGone(f"pod {namespace}/{name}: {error}") from error
            except Invalid:
                # Our guess of the index was wrong (or the gate is gone): look.
                try:
                    pod = await self.api.get(path)
                except NotFound as error:
                    raise ConsumerGone(f"pod {namespace}/{name}: {error}") from error
                if uid and (pod.get("metadata") or {}).get("uid") != uid:
                    raise ConsumerGone(f"pod {namespace}/{name} was replaced") from None
                gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates")
                         or []]
                if ADMISSION_GATE not in gates:
                    return False
                index = gates.index(ADMISSION_GATE)
        raise ApiError(409, "Conflict", f"pod {namespace}/{name}: gates kept changing")

    async def release(self, unit: UnitRecord, pods: Sequence[PodRecord] = ()) -> None:
        """Let the unit's consumer go: unsuspend its Job or ungate its pod(s).

        Idempotent: releasing what runs already is a no-op. Raises
        ConsumerGone when there is nothing to release any more.
        """
        consumer = unit.consumer
        if consumer is None:
            return  # a reservation: the status is the whole admission
        directives = self.directives(unit)
        if consumer.kind == "Job" and unit.replicas:
            await self._with_retries(
                f"unsuspend Job {unit.namespace}/{consumer.name}",
                lambda: self.release_job_partly(unit, directives))
        elif consumer.kind == "Job":
            if directives:
                await self._with_retries(
                    f"unsuspend Job {unit.namespace}/{consumer.name}",
                    lambda: self.release_job_placed(unit.namespace, consumer.name,
                                                    consumer.uid, directives))
            else:
                await self.set_job_suspend(unit.namespace, consumer.name, consumer.uid, False)
        elif consumer.kind == "Pod":
            await self._with_retries(
                f"ungate pod {unit.namespace}/{consumer.name}",
                lambda: self.ungate(unit.namespace, consumer.name, consumer.uid, directives),
            )
        elif consumer.kind in WORKLOAD_CONSUMERS:
            await self.release_workload(unit, pods, directives)
        elif consumer.kind == "PodGroup":
            # Only the pods admitted with it: one labelled into the group
            # afterwards stays gated (DESIGN §13).
            gated = [p for p in pods if p.gated and (not unit.members or p.uid in unit.members)]
            results = await asyncio.gather(
                *(self.ungate(p.namespace, p.name, p.uid, directives) for p in gated),
                return_exceptions=True,
            )
            failures = [r for r in results
                        if isinstance(r, BaseException) and not isinstance(r, ConsumerGone)]
            if failures:
                raise failures[0]

    async def ungate(self, namespace: str, name: str, uid: str,
                     directives: PodDirectives) -> bool:
        if not directives:
            return await self.remove_gate(namespace, name, uid)
        return await self._patch_read(
            pod_path(namespace, name), uid, f"pod {namespace}/{name}",
            lambda pod: pod_release_ops(pod, directives))

    async def release_job_placed(self, namespace: str, name: str, uid: str,
                                 directives: PodDirectives) -> None:
        """Unsuspend a Job, adding the pool's directives to its pod template
        (only while it is suspended: a running Job's template is fixed)."""

        def ops(job: Obj) -> list[dict[str, Any]] | None:
            return job_release_ops(job, directives) \
                if (job.get("spec") or {}).get("suspend") else None

        await self._patch_read(job_path(namespace, name), uid, f"Job {namespace}/{name}", ops,
                               before=self._unlock_template)

    async def release_job_partly(self, unit: UnitRecord, directives: PodDirectives) -> None:
        """Unsuspend a Job admitted with fewer pods than it asked: its
        parallelism (and completions, when they were equal and the Job is
        Indexed: only then may they change) become the admitted count."""
        consumer = unit.consumer
        assert consumer is not None
        count = sum(ps.count for ps in unit.admitted_pod_sets)

        def ops(job: Obj) -> list[dict[str, Any]] | None:
            spec = job.get("spec") or {}
            if not spec.get("suspend"):
                return None
            release = job_release_ops(job, directives) if directives else \
                [{"op": "add", "path": "/spec/suspend", "value": False}]
            return [*parallelism_ops(spec, count), *release]

        await self._patch_read(job_path(unit.namespace, consumer.name), consumer.uid,
                               f"Job {unit.namespace}/{consumer.name}", ops,
                               before=self._unlock_template)

    async def _unlock_template(self, path: str, job: Obj, ops: list[dict[str, Any]]) -> None:
        """Let a held Job's pod template change, as Kueue does on stop: the
        apiserver takes a template change only while the Job is suspended,
        shows no active pod, and has no status.startTime or says Suspended.
        The Job controller says so once it has seen the suspension, which
        under load takes minutes; so the startTime goes here, guarded by the
        suspension and no active pod (the controller sets it again on
        resume). While pods are active the release would be refused: it is
        not tried, and is retried later."""
        if not any(op["path"].startswith("/spec/template") for op in ops):
            return
        status = job.get("status") or {}
        if status.get("active"):
            raise ApiError(409, "Conflict", f"{path}: {status['active']} pod(s) of its last "
                           "admission still active; its template changes once the Job "
                           "controller has removed them")
        if not status.get("startTime") or any(
                c.get("type") == "Suspended" and c.get("status") == "True"
                for c in status.get("conditions") or () if isinstance(c, Mapping)):
            return
        uid = (job.get("metadata") or {}).get("uid")
        guard: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}] \
            if uid else []
        try:
            await self.api.json_patch(path + "/status", [
                *guard,
                {"op": "test", "path": "/spec/suspend", "value": True},
                {"op": "test", "path": "/status/active", "value": None},
                {"op": "remove", "path": "/status/startTime"},
            ])
        except (Invalid, Conflict, NotFound) as error:
            log.debug("startTime of %s kept: %s", path, error)

    async def _patch_read(
        self, path: str, uid: str, what: str,
        build: Callable[[Obj], list[dict[str, Any]] | None],
        before: Callable[[str, Obj, list[dict[str, Any]]], Awaitable[None]] | None = None,
    ) -> bool:
        """Read the object, JSON-patch what `build` says (with the guards
        `build` puts first), again if a guard or a check refused it; False
        when `build` finds nothing to do. `before(path, obj, ops)` runs
        before each patch (a write the patch needs first)."""
        last: ApiError | None = None
        for _ in range(4):
            try:
                obj = await self.api.get(path)
            except NotFound as error:
                raise ConsumerGone(f"{what}: {error}") from error
            if uid and (obj.get("metadata") or {}).get("uid") != uid:
                raise ConsumerGone(f"{what} was replaced")
            ops = build(obj)
            if ops is None:
                return False
            if before is not None:
                await before(path, obj, ops)
            try:
                await self.api.json_patch(path, ops)
                return True
            except NotFound as error:
                raise ConsumerGone(f"{what}: {error}") from error
            except (Invalid, Conflict) as error:
                last = error  # most often changed since the read: read again
        # Refused on every fresh read is seldom a race (e.g. a check the
        # apiserver makes): name the refusal.
        raise ApiError(409, "Conflict", f"{what}: kept changing (last: {last})")

    async def hold(self, unit: UnitRecord, pods: Sequence[PodRecord] = ()) -> str:
        """Hold a released consumer again: suspend a Job or a suspend-held
        workload (taking its placement off), or delete a gate-held
        workload's pods (its controller makes them again, gated). A plain
        pod cannot be held after release. Returns a Job's resourceVersion
        after the suspend ("" for anything else)."""
        consumer = unit.consumer
        if consumer is not None and consumer.kind == "Job":
            return await self.set_job_suspend(unit.namespace, consumer.name, consumer.uid, True)
        if consumer is not None and consumer.kind in WORKLOAD_CONSUMERS:
            await self.hold_workload(unit, pods)
        return ""

    # -- workloads of the integrations (arbiter.integrations) ------------------------
    async def release_workload(self, unit: UnitRecord, pods: Sequence[PodRecord],
                               directives: PodDirectives) -> None:
        """Unsuspend a suspend-held workload with its pool's directives in
        every pod template, or let go as many of a gate-held one's gated
        pods as its admitted count leaves room for (both for a suspend-held
        kind whose pods arrive gated: unsuspended first, its pods come later)."""
        consumer = unit.consumer
        assert consumer is not None
        integration = BY_KIND[consumer.kind]
        what = f"{consumer.kind} {unit.namespace}/{consumer.name}"
        if integration.hold == "gate" or integration.gated_pods:
            letting = to_let_go(unit, pods)
            results = await asyncio.gather(
                *(self.ungate(p.namespace, p.name, p.uid, directives) for p in letting),
                return_exceptions=True)
            failures = [r for r in results
                        if isinstance(r, BaseException) and not isinstance(r, ConsumerGone)]
            if failures:
                raise failures[0]
            if letting or integration.hold == "gate":
                return  # pods come only once it is unsuspended

        def ops(obj: Obj) -> list[dict[str, Any]] | None:
            if not integration.suspended(obj):
                return None
            own = integration.placement_ops(  # a kind placed through a field of its own
                obj, [pod_set.name for pod_set in unit.pod_sets], dict(directives.node_selector),
                [toleration.to_api() for toleration in directives.tolerations])
            return placed_ops(obj, [pointer(t) for t in integration.templates(obj)],
                              directives, [*own, *integration.suspend_ops(False)])

        await self._with_retries(f"unsuspend {what}", lambda: self._patch_read(
            integration.object_path(unit.namespace, consumer.name), consumer.uid, what, ops))

    async def hold_workload(self, unit: UnitRecord, pods: Sequence[PodRecord]) -> None:
        consumer = unit.consumer
        assert consumer is not None
        integration = BY_KIND[consumer.kind]
        what = f"{consumer.kind} {unit.namespace}/{consumer.name}"
        if integration.hold == "gate":
            for pod in pods:
                if not pod.terminating and pod.phase not in ("Succeeded", "Failed"):
                    try:
                        await self.api.delete_guarded(pod_path(pod.namespace, pod.name), pod.uid)
                    except (NotFound, Conflict):
                        continue  # gone, or a namesake replaced it
            return

        def ops(obj: Obj) -> list[dict[str, Any]] | None:
            if integration.suspended(obj):
                return None
            return placed_ops(obj, [pointer(t) for t in integration.templates(obj)],
                              NOTHING, integration.suspend_ops(True))

        await self._with_retries(f"suspend {what}", lambda: self._patch_read(
            integration.object_path(unit.namespace, consumer.name), consumer.uid, what, ops))
