"""Attempts from observed Jobs and the flow's last status; the new status.

The flow's status is the controller's memory: an attempt whose Job is gone
(deleted by `jobRetainPolicy: delete`, or by someone) keeps the phase the
status recorded for it; one that was Pending or Running when its Job
vanished is `Terminated`. Everything here is pure: times come in as
arguments, the status goes out as a dict that is equal to the previous one
when nothing changed (so it is written only then).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from arbiter.cache.records import JobRecord
from arbiter.core.api import (
    ATTEMPT_ANNOTATION,
    FLOW_UID_ANNOTATION,
    STEP_ANNOTATION,
    format_rfc3339,
    parse_time,
)
from arbiter.jobflow.dag import (
    Attempt,
    AttemptPhase,
    Evaluation,
    Step,
    StepPhase,
    job_name,
)

Obj = dict[str, Any]
ATTEMPT_PHASES: frozenset[str] = frozenset({"Pending", "Running", "Succeed", "Failed",
                                            "Terminated"})
FINISHED_ATTEMPTS: frozenset[str] = frozenset({"Succeed", "Failed", "Terminated"})
CONDITION_TYPES: tuple[tuple[str, str], ...] = (
    ("Running", "Running"), ("Succeeded", "Succeed"), ("Failed", "Failed"),
)


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One attempt of a step: its Job as observed or as last recorded."""

    step: str
    index: int
    job_name: str
    phase: AttemptPhase
    # When the attempt's Job was created, started and finished (epoch seconds; 0.0 until then).
    created: float = 0.0
    started: float = 0.0
    finished: float = 0.0
    pods_ran: bool = False
    # False when the apiserver refused the Job (no Job exists for it).
    job_created: bool = True
    retryable: bool = True
    reason: str = ""
    message: str = ""

    def as_attempt(self) -> Attempt:
        return Attempt(index=self.index, phase=self.phase, started=self.pods_ran,
                       retryable=self.retryable)


# -- times ------------------------------------------------------------------
def format_time(seconds: float) -> str | None:
    if seconds <= 0:
        return None
    return format_rfc3339(seconds)


def format_duration(seconds: float) -> str:
    """Go's time.Duration style, to the second: 1h2m3s, 4m0s, 5s."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


# -- observing --------------------------------------------------------------
def observe_job(record: JobRecord, flow_uid: str) -> AttemptInfo | None:
    """The attempt a Job of this flow is; None for a Job not created by it."""
    annotations = dict(record.annotations)
    if annotations.get(FLOW_UID_ANNOTATION) != flow_uid:
        return None
    step = annotations.get(STEP_ANNOTATION)
    try:
        index = int(annotations.get(ATTEMPT_ANNOTATION, ""))
    except ValueError:
        return None
    if not step or index < 0:
        return None
    phase: AttemptPhase
    if record.outcome == "Complete":
        phase = "Succeed"
    elif record.outcome == "Failed":
        phase = "Failed"
    elif not record.suspended and record.ready > 0:
        phase = "Running"
    else:
        phase = "Pending"
    pods_ran = phase in ("Running", "Succeed") or (phase == "Failed" and record.start_time > 0)
    return AttemptInfo(
        step=step, index=index, job_name=record.name, phase=phase, created=record.created,
        started=record.start_time, finished=record.finish_time if phase in FINISHED_ATTEMPTS
        else 0.0, pods_ran=pods_ran,
    )


def _recorded(status: Mapping[str, Any]) -> dict[tuple[str, int], AttemptInfo]:
    """The attempts the last status recorded; malformed entries are ignored."""
    found: dict[tuple[str, int], AttemptInfo] = {}
    steps = status.get("steps")
    if not isinstance(steps, list):
        return found
    for entry in steps:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        for item in entry.get("history") or []:
            if not isinstance(item, dict):
                continue
            index, phase = item.get("attempt"), item.get("phase")
            if not isinstance(index, int) or phase not in ATTEMPT_PHASES:
                continue
            try:
                info = AttemptInfo(
                    step=entry["name"], index=index,
                    job_name=str(item.get("jobName", "")),
                    phase=cast(AttemptPhase, phase),
                    created=parse_time(item.get("createTime")),
                    started=parse_time(item.get("startTime")),
                    finished=parse_time(item.get("finishTime")),
                    pods_ran=bool(item.get("podsRan", False)),
                    job_created=item.get("reason") != "InvalidJob",
                    retryable=item.get("reason") != "InvalidJob",
                    reason=str(item.get("reason", "") or ""),
                    message=str(item.get("message", "") or ""),
                )
            except (TypeError, ValueError):
                continue
            found[(entry["name"], index)] = info
    return found


def collect_attempts(
    steps: Sequence[Step],
    previous_status: Mapping[str, Any],
    observed: Iterable[AttemptInfo],
    now: float,
) -> dict[str, list[AttemptInfo]]:
    """Every step's attempts: observed Jobs first, then what the status recorded."""
    names = {step.name for step in steps}
    seen = {(a.step, a.index): a for a in observed if a.step in names}
    recorded = _recorded(previous_status)
    result: dict[str, list[AttemptInfo]] = {name: [] for name in names}
    for key in sorted(set(seen) | {k for k in recorded if k[0] in names}):
        info = seen.get(key)
        if info is None:
            info = recorded[key]
            if info.phase not in FINISHED_ATTEMPTS:
                # Its Job vanished before finishing: that attempt is over.
                info = replace(info, phase="Terminated", finished=now,
                               reason="JobDeleted",
                               message="the Job was deleted before it finished")
        else:
            old = recorded.get(key)
            if old is not None and old.pods_ran and not info.pods_ran:
                info = replace(info, pods_ran=True)
        result[key[0]].append(info)
    return result


# -- status -----------------------------------------------------------------
def _attempt_status(info: AttemptInfo) -> Obj:
    entry: Obj = {"attempt": info.index, "jobName": info.job_name, "phase": info.phase}
    for key, value in (("createTime", info.created), ("startTime", info.started),
                       ("finishTime", info.finished)):
        text = format_time(value)
        if text is not None:
            entry[key] = text
    if info.pods_ran:
        entry["podsRan"] = True
    if info.reason:
        entry["reason"] = info.reason
    if info.message:
        entry["message"] = info.message
    return entry


def running_seconds(tries: Sequence[AttemptInfo]) -> float:
    return sum(max(0.0, a.finished - a.started) for a in tries
               if a.started > 0 and a.finished > 0)


def _conditions(phase: str, message: str, previous: Mapping[str, Any], now: float) -> list[Obj]:
    old: dict[str, Mapping[str, Any]] = {}
    for item in previous.get("conditions") or []:
        if isinstance(item, dict) and isinstance(item.get("type"), str):
            old[item["type"]] = item
    conditions: list[Obj] = []
    for kind, when in CONDITION_TYPES:
        status = "True" if phase == when else "False"
        before = old.get(kind)
        if before is None and status == "False":
            continue
        if before is None or before.get("status") != status:
            since = format_time(now)
        else:
            since = before.get("lastTransitionTime")
        condition: Obj = {"type": kind, "status": status, "reason": phase}
        if since:
            condition["lastTransitionTime"] = since
        if status == "True" and message:
            condition["message"] = message
        conditions.append(condition)
    return conditions


def render_status(
    *,
    flow: str,
    steps: Sequence[Step],
    evaluation: Evaluation,
    attempts: Mapping[str, Sequence[AttemptInfo]],
    previous_status: Mapping[str, Any],
    generation: int,
    now: float,
    notes: Mapping[str, str] | None = None,
) -> Obj:
    """The flow's status. `notes[step]` explains a step the controller could
    not act on (its JobTemplate is missing, the create failed)."""
    notes = notes or {}
    lists: dict[str, list[str]] = {
        "pendingJobs": [], "runningJobs": [], "completedJobs": [], "failedJobs": [],
        "terminatedJobs": [],
    }
    list_of = {"Pending": "pendingJobs", "Running": "runningJobs", "Succeed": "completedJobs",
               "Failed": "failedJobs", "Terminated": "terminatedJobs"}
    step_entries: list[Obj] = []
    for step in steps:
        tries = sorted(attempts.get(step.name, ()), key=lambda a: a.index)
        phase: StepPhase = evaluation.phases.get(step.name, "Waiting")
        entry: Obj = {"name": step.name, "template": step.template, "phase": phase,
                      "restartCount": tries[-1].index if tries else 0}
        if tries:
            latest = tries[-1]
            entry["jobName"] = latest.job_name
            first_created = format_time(tries[0].created)
            if first_created:
                entry["createTime"] = first_created
            started = format_time(min((a.started for a in tries if a.started > 0), default=0))
            if started:
                entry["startTime"] = started
            if phase in ("Succeed", "Failed") and latest.finished > 0:
                entry["finishTime"] = format_time(latest.finished)
                entry["runningDuration"] = format_duration(running_seconds(tries))
            entry["history"] = [_attempt_status(a) for a in tries]
        else:
            entry["jobName"] = job_name(flow, step.name, 0)
        message = notes.get(step.name) or evaluation.reasons.get(step.name, "")
        if phase == "Failed" and tries and tries[-1].message:
            message = f"{message}: {tries[-1].message}" if message else tries[-1].message
        if message:
            entry["message"] = message
        step_entries.append(entry)
        for a in tries:
            if a.job_created:
                lists[list_of[a.phase]].append(a.job_name)

    flow_message = ""
    if evaluation.phase == "Failed" and evaluation.failed:
        name = evaluation.failed[0]
        flow_message = f"step {name} {evaluation.reasons.get(name, 'failed')}"
    elif evaluation.phase == "Terminating":
        flow_message = "the flow is being deleted"
    state: Obj = {"phase": evaluation.phase}
    if flow_message:
        state["message"] = flow_message
    skipped = sum(1 for p in evaluation.phases.values() if p == "Skipped")
    succeeded = sum(1 for p in evaluation.phases.values() if p == "Succeed")
    status: Obj = {
        "observedGeneration": generation,
        "state": state,
        # The "Completed" printer column: succeeded / steps that run.
        "progress": f"{succeeded}/{len(steps) - skipped}",
        **lists,
        "steps": step_entries,
        "conditions": _conditions(evaluation.phase, flow_message, previous_status, now),
    }
    return status
