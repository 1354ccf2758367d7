"""The JobFlow controller (leader only): observed Jobs in, Jobs and status out.

Event-driven from the cache: a change to a JobFlow, to one of its Jobs or to
a JobTemplate of its namespace marks the flow dirty; one task reconciles
dirty flows one at a time. Each reconcile is the pure decision
(`dag.evaluate`) run to a fixpoint: create the attempts it asks for, add
them to what is observed, decide again (a Job that is refused as invalid
fails its step, which can trigger `condition: Failed` steps at once).

Never two Jobs for one attempt: names are deterministic (`<flow>-<step>`,
`<flow>-<step>-r<n>`), a create answered AlreadyExists adopts the Job when it
is this flow's, and a Job created but not yet seen by the cache is
remembered (an "expectation") so it is not taken for missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from arbiter.base import metrics
from arbiter.base.aio import wait_event
from arbiter.base.kubeapi import (
    AlreadyExists,
    ApiError,
    Denied,
    Invalid,
    KubeApi,
    NotFound,
    job_path,
    jobflow_path,
    request_json,
)
from arbiter.cache import convert
from arbiter.cache.jobflow_records import JobFlowRecord
from arbiter.cache.store import ClusterStore, Kind
from arbiter.core.api import FLOW_ANNOTATION, QUEUE_LABEL
from arbiter.jobflow.dag import CycleError, Evaluation, Step, evaluate, job_name
from arbiter.jobflow.patch import build_job
from arbiter.jobflow.state import (
    AttemptInfo,
    collect_attempts,
    observe_job,
    render_status,
    running_seconds,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# Kinds the controller must have listed before it may trust "missing".
NEEDED_KINDS: frozenset[Kind] = frozenset({"Job", "JobFlow", "JobTemplate"})
RESYNC_SECONDS = 60.0
EXPECTATION_SECONDS = 300.0
MAX_BACKOFF = 60.0
# Bound on decide-create rounds in one reconcile (each round creates >= 1 Job).
MAX_ROUNDS = 64


class FlowApi(Protocol):
    async def get(self, path: str) -> Obj: ...

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj: ...

    async def json_patch(self, path: str, ops: Sequence[Mapping[str, Any]]) -> Obj: ...

    async def delete(self, path: str) -> None: ...


class KubeFlowApi(KubeApi):
    """`FlowApi` over a kubernetes_asyncio ApiClient: the loop's KubeApi + DELETE."""

    async def delete(self, path: str) -> None:
        with contextlib.suppress(NotFound):
            await request_json(self._client, "DELETE", path,
                               body={"propagationPolicy": "Background"})


@dataclass(frozen=True, slots=True)
class _Blocked:
    """A step attempt that could not be created now, and why."""

    message: str
    # Retry on a timer; otherwise wait for an event (a JobTemplate appears).
    transient: bool = True


def _step_phases(status: Mapping[str, Any]) -> dict[str, str]:
    phases: dict[str, str] = {}
    for entry in status.get("steps") or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            phases[entry["name"]] = str(entry.get("phase", ""))
    return phases


def _flow_phase(status: Mapping[str, Any]) -> str:
    state = status.get("state")
    return str(state.get("phase", "")) if isinstance(state, dict) else ""


class JobFlowController:
    def __init__(
        self,
        store: ClusterStore,
        api: FlowApi,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._api = api
        self._clock = clock
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        # flow key -> its Jobs' keys, and back (a deleted Job has no record).
        self._jobs_of: dict[str, set[str]] = {}
        self._flow_of: dict[str, str] = {}
        # Job key -> (attempt, deadline): created, not yet in the cache.
        self._expected: dict[str, tuple[AttemptInfo, float]] = {}
        # flow key -> (uid, status) last written: newer than the cache for a while.
        self._written: dict[str, tuple[str, Obj]] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._deleted: set[str] = set()
        for key in list(store.jobs):
            self._index_job(key)
        store.listeners.append(self._on_change)

    # -- events -------------------------------------------------------------
    def _on_change(self, kind: Kind, key: str) -> None:
        if kind == "JobFlow":
            self._mark(key)
        elif kind == "Job":
            flow = self._index_job(key)
            if flow is not None:
                self._mark(flow)
        elif kind == "JobTemplate":
            namespace = key.partition("/")[0]
            for record in self._store.jobflows.values():
                if record.namespace == namespace and record.phase not in ("Succeed", "Failed"):
                    self._mark(record.key)

    def _index_job(self, key: str) -> str | None:
        """Keep the flow <-> Job index current; the flow the Job belongs to."""
        record = self._store.jobs.get(key)
        flow: str | None = None
        if record is not None:
            self._expected.pop(key, None)
            name = dict(record.annotations).get(FLOW_ANNOTATION)
            if name:
                flow = f"{record.namespace}/{name}"
        else:
            self._deleted.discard(key)
        old = self._flow_of.get(key)
        if old is not None and old != flow:
            self._jobs_of.get(old, set()).discard(key)
            del self._flow_of[key]
        if flow is not None:
            self._flow_of[key] = flow
            self._jobs_of.setdefault(flow, set()).add(key)
        return flow or old

    def _mark(self, key: str) -> None:
        self._dirty.add(key)
        self._wake.set()

    def _retry_later(self, key: str) -> None:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = min(MAX_BACKOFF, 0.5 * 2 ** min(failures, 8))
        self._retry_at[key] = time.monotonic() + delay
        self._wake.set()

    # -- the loop -----------------------------------------------------------
    async def run(self) -> None:
        """Reconcile until cancelled (on losing leadership the caller cancels)."""
        self._written.clear()
        while not self._store.synced_kinds >= NEEDED_KINDS:
            # Listing ends with a burst of events; check again after each.
            await wait_event(self._wake, 0.5)
            self._wake.clear()
        for key in list(self._store.jobflows):
            self._mark(key)
        next_resync = time.monotonic() + RESYNC_SECONDS
        while True:
            wake_at = min([next_resync, *self._retry_at.values()])
            timeout = max(0.0, wake_at - time.monotonic())
            if not self._dirty:
                await wait_event(self._wake, timeout)
            self._wake.clear()
            now = time.monotonic()
            for key, due in list(self._retry_at.items()):
                if due <= now:
                    del self._retry_at[key]
                    self._dirty.add(key)
            if now >= next_resync:
                next_resync = now + RESYNC_SECONDS
                self._dirty.update(f.key for f in self._store.jobflows.values()
                                   if f.phase not in ("Succeed",))
            await self.reconcile_dirty()

    async def reconcile_dirty(self) -> None:
        keys = sorted(self._dirty)
        self._dirty.clear()
        for key in keys:
            try:
                await self.reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconciling JobFlow %s failed", key)
                self._retry_later(key)

    # -- one flow -----------------------------------------------------------
    def _memory(self, flow: JobFlowRecord) -> Mapping[str, Any]:
        written = self._written.get(flow.key)
        if written is not None and written[0] == flow.uid:
            return written[1]
        return flow.status

    def _observed(self, flow: JobFlowRecord, now: float) -> dict[tuple[str, int], AttemptInfo]:
        found: dict[tuple[str, int], AttemptInfo] = {}
        for key in sorted(self._jobs_of.get(flow.key, ())):
            record = self._store.jobs.get(key)
            info: AttemptInfo | None = None
            if record is not None:
                info = observe_job(record, flow.uid)
            elif key in self._expected:
                info, deadline = self._expected[key]
                if deadline < now:
                    del self._expected[key]
                    info = None
            if info is not None:
                found[(info.step, info.index)] = info
        return found

    def _forget(self, key: str) -> None:
        self._written.pop(key, None)
        self._retry_at.pop(key, None)
        self._failures.pop(key, None)

    async def reconcile(self, key: str) -> None:
        flow = self._store.jobflows.get(key)
        if flow is None:
            self._forget(key)
            return
        now = self._clock()
        memory = self._memory(flow)
        if flow.spec is None:
            await self._write_status(flow, memory, self._broken_status(
                flow, memory, f"invalid spec: {flow.spec_error}", now), {})
            return
        steps = flow.spec.steps
        by_name = {step.name: step for step in steps}
        observed = self._observed(flow, now)
        notes: dict[str, str] = {}
        blocked: set[str] = set()
        transient = False
        attempts: dict[str, list[AttemptInfo]] = {}
        evaluation: Evaluation | None = None
        for _ in range(MAX_ROUNDS):
            attempts = collect_attempts(steps, memory, observed.values(), now)
            try:
                evaluation = evaluate(
                    steps, {name: [a.as_attempt() for a in tries]
                            for name, tries in attempts.items()},
                    terminating=flow.deleting)
            except CycleError as error:
                await self._write_status(flow, memory, self._broken_status(
                    flow, memory, f"spec.flows: {error}", now), {})
                return
            todo = [(name, index) for name, index in evaluation.create if name not in blocked]
            if not todo:
                break
            for name, index in todo:
                result = await self._create(flow, by_name[name], index, now)
                if isinstance(result, AttemptInfo):
                    observed[(name, index)] = result
                else:
                    notes[name] = result.message
                    blocked.add(name)
                    transient = transient or result.transient
        assert evaluation is not None
        status = render_status(flow=flow.name, steps=steps, evaluation=evaluation,
                               attempts=attempts, previous_status=memory,
                               generation=flow.generation, now=now, notes=notes)
        await self._write_status(flow, memory, status, attempts)
        if evaluation.phase == "Succeed" and flow.spec.retain_policy == "delete":
            await self._delete_jobs(flow)
        if transient:
            self._retry_later(key)
        else:
            self._failures.pop(key, None)

    def _broken_status(self, flow: JobFlowRecord, memory: Mapping[str, Any], message: str,
                       now: float) -> Obj:
        """A flow the controller cannot run (bad spec, cycle): Failed, no Jobs."""
        steps = flow.spec.steps if flow.spec is not None else ()
        evaluation = Evaluation(phases={s.name: "Skipped" for s in steps},
                                reasons={s.name: message for s in steps}, create=(),
                                phase="Terminating" if flow.deleting else "Failed")
        status = render_status(flow=flow.name, steps=steps, evaluation=evaluation,
                               attempts={}, previous_status=memory,
                               generation=flow.generation, now=now)
        if not flow.deleting:
            status["state"]["message"] = message
        return status

    async def _create(self, flow: JobFlowRecord, step: Step, index: int,
                      now: float) -> AttemptInfo | _Blocked:
        assert flow.spec is not None
        namespace = flow.namespace
        template = self._store.jobtemplates.get(f"{namespace}/{step.template}")
        if template is None:
            return _Blocked(f'JobTemplate "{step.template}" not found in namespace '
                            f'"{namespace}"', transient=False)
        queue = flow.spec.queue or self._store.resolve_queue(
            namespace, {QUEUE_LABEL: flow.queue_label} if flow.queue_label else None)
        name = job_name(flow.name, step.name, index)
        body = build_job(flow=flow.name, flow_uid=flow.uid, namespace=namespace,
                         step=step.name, attempt=index, name=name,
                         template_spec=template.spec, patch=flow.spec.patches.get(step.name),
                         queue=queue)
        job_key = f"{namespace}/{name}"
        try:
            created = await self._api.create(job_path(namespace), body)
        except AlreadyExists:
            return await self._adopt(flow, step, index, name)
        except Invalid as error:
            if "admission webhook" in error.message:
                return _Blocked(f"Job {name} was denied: {error.message}")
            log.info("JobFlow %s: Job %s is invalid: %s", flow.key, name, error.message)
            return AttemptInfo(step=step.name, index=index, job_name=name, phase="Failed",
                               created=now, finished=now, job_created=False,
                               retryable=False, reason="InvalidJob",
                               message=f'JobTemplate "{step.template}": {error.message}')
        except Denied as error:
            return _Blocked(f"Job {name} was denied: {error.message}")
        except ApiError as error:
            return _Blocked(f"creating Job {name} failed: {error}")
        info = self._observe_raw(created, flow.uid)
        if info is None:
            return _Blocked(f"Job {name} was created without the flow's annotations")
        log.info("JobFlow %s: created Job %s", flow.key, name)
        if job_key not in self._store.jobs:
            self._expected[job_key] = (info, now + EXPECTATION_SECONDS)
            self._flow_of[job_key] = flow.key
            self._jobs_of.setdefault(flow.key, set()).add(job_key)
        return info

    async def _adopt(self, flow: JobFlowRecord, step: Step, index: int,
                     name: str) -> AttemptInfo | _Blocked:
        """AlreadyExists: ours (a restart, or the cache lags) or a stranger's."""
        try:
            existing = await self._api.get(job_path(flow.namespace, name))
        except ApiError as error:
            return _Blocked(f"reading Job {name} failed: {error}")
        info = self._observe_raw(existing, flow.uid)
        if info is None or info.step != step.name or info.index != index:
            return _Blocked(f'a Job named "{name}" already exists and does not belong to '
                            "this flow: delete or rename it", transient=False)
        return info

    @staticmethod
    def _observe_raw(obj: Mapping[str, Any], flow_uid: str) -> AttemptInfo | None:
        try:
            return observe_job(convert.job_from_api(obj), flow_uid)
        except convert.ConversionError:
            return None

    async def _write_status(self, flow: JobFlowRecord, memory: Mapping[str, Any], status: Obj,
                            attempts: Mapping[str, Sequence[AttemptInfo]]) -> None:
        if status == memory:
            return
        ops: list[Obj] = [{"op": "test", "path": "/metadata/uid", "value": flow.uid},
               {"op": "add", "path": "/status", "value": status}]
        try:
            await self._api.json_patch(jobflow_path(flow.namespace, flow.name, status=True), ops)
        except (NotFound, Invalid):
            return  # deleted, or replaced by a new flow of the same name
        self._written[flow.key] = (flow.uid, status)
        phase = _flow_phase(status)
        if phase != _flow_phase(memory):
            metrics.jobflow_phase_total.labels(phase).inc()
            log.info("JobFlow %s is %s", flow.key, phase)
        before = _step_phases(memory)
        for entry in status["steps"]:
            name = entry["name"]
            if entry["phase"] in ("Succeed", "Failed") and before.get(name) != entry["phase"]:
                tries = attempts.get(name, ())
                if tries:
                    metrics.jobflow_step_duration_seconds.observe(running_seconds(tries))

    async def _delete_jobs(self, flow: JobFlowRecord) -> None:
        for key in sorted(self._jobs_of.get(flow.key, ())):
            if key in self._deleted or key not in self._store.jobs:
                continue
            namespace, _, name = key.partition("/")
            with contextlib.suppress(NotFound):
                await self._api.delete(job_path(namespace, name))
            self._deleted.add(key)

    def close(self) -> None:
        """Stop listening to the store (a new controller starts each leadership term)."""
        with contextlib.suppress(ValueError):
            self._store.listeners.remove(self._on_change)


async def run_leader(*, api: Any | None, store: ClusterStore) -> None:
    """Leader-only work (one of `arbiter.server.app.leader_tasks`): a fresh
    controller for each leadership term, restarted after a crash."""
    if api is None:
        return
    flow_api = KubeFlowApi(api)
    backoff = 1.0
    while True:
        controller = JobFlowController(store, flow_api)
        try:
            await controller.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the JobFlow controller failed; restarting in %.0fs", backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
        finally:
            controller.close()
