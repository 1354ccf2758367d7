"""Admission checks (DESIGN §12): the part of a unit's life between quota
reservation and the start of its work. Pure functions of cache records.

    Enqueued ──engine reserves quota──▶ Reserved (status.admissionChecks: all Pending)
    Reserved ──every check Ready──────▶ Dequeued (lastAllocateTime = now; work released)
    Reserved ──a check Retry / timeout▶ Enqueued (quota freed; status.requeueAt = now + delay)
    Reserved ──a check Rejected───────▶ Failed   (the work never starts; Event + condition)

Everything a decision needs is in the unit's status (each check's state and
lastTransitionTime, requeueAt), so a restarted leader carries on where the
last one stopped: a Reserved unit is counted as admitted (its quota held)
and is never reserved twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from arbiter.base import metrics
from arbiter.cache.records import AdmissionCheckRecord, QueueRecord, UnitCheck, UnitRecord
from arbiter.core.api import format_rfc3339
from arbiter.loop.units import NOTHING, Step

# The condition a rejected unit carries (besides phase Failed and its message).
REJECTED_CONDITION = "AdmissionCheckRejected"


def checks_for(unit: UnitRecord, queue: QueueRecord | None) -> tuple[str, ...]:
    """The admission checks `unit` must pass: its queue's, where the
    selector matches the unit's labels."""
    if queue is None or not queue.admission_checks:
        return ()
    labels = dict(unit.labels)
    return tuple(check.name for check in queue.admission_checks if check.applies(labels))


def pending_checks_status(names: Sequence[str], now: float) -> list[dict[str, Any]]:
    """status.admissionChecks of a unit whose quota was just reserved."""
    stamp = format_rfc3339(now)
    return [{"name": name, "state": "Pending", "message": "", "lastTransitionTime": stamp}
            for name in names]


def _timed_out(check: UnitCheck, spec: AdmissionCheckRecord | None, now: float) -> bool:
    return check.state == "Pending" and spec is not None and spec.timeout is not None \
        and check.since > 0 and now >= check.since + spec.timeout


def check_step(unit: UnitRecord, now: float,
               specs: Mapping[str, AdmissionCheckRecord]) -> Step:
    """What a Reserved unit's checks call for (NOTHING while any is Pending).
    A rejection wins over a retry, a retry over readiness."""
    if not unit.reserved:
        return NOTHING
    rejected = [c for c in unit.checks if c.state == "Rejected"]
    if rejected:
        first = rejected[0]
        return Step("reject", "Failed", f"admission check {first.name} rejected the unit"
                    + (f": {first.message}" if first.message else ""))
    retry = [c for c in unit.checks if c.state == "Retry"]
    timed_out = [c for c in unit.checks if _timed_out(c, specs.get(c.name), now)]
    if retry or timed_out:
        names = [c.name for c in (*retry, *timed_out)]
        delay = max((specs[n].retry_delay for n in names if n in specs), default=0)
        if retry:
            why = f"admission check {retry[0].name} asked for a retry" \
                + (f": {retry[0].message}" if retry[0].message else "")
        else:
            spec = specs[timed_out[0].name]
            why = f"admission check {timed_out[0].name} timed out after {spec.timeout}s"
        return Step("requeue", "Enqueued", f"{why}; quota freed, requeued in {delay}s",
                    delay=float(delay))
    if all(c.state == "Ready" for c in unit.checks):
        passed = ", ".join(c.name for c in unit.checks)
        return Step("checked", "Dequeued", f"admitted by queue {unit.queue}; "
                    f"admission checks passed: {passed}")
    return NOTHING


def check_deadline(unit: UnitRecord, specs: Mapping[str, AdmissionCheckRecord]) -> float | None:
    """When the first Pending check of a Reserved unit times out (None: never)."""
    if not unit.reserved:
        return None
    deadlines = [c.since + spec.timeout for c in unit.checks
                 if c.state == "Pending" and c.since > 0
                 and (spec := specs.get(c.name)) is not None and spec.timeout is not None]
    return min(deadlines, default=None)


def checked_status(message: str, now: float) -> dict[str, Any]:
    """Every check Ready: admitted for real; the admission timeout counts from now."""
    return {"phase": "Dequeued", "message": message, "lastAllocateTime": format_rfc3339(now)}


def requeued_status(message: str, now: float, delay: float) -> dict[str, Any]:
    """A check asked for a retry (or timed out): the quota is freed and the
    unit waits `delay` seconds before it may be admitted again."""
    return {"phase": "Enqueued", "message": message, "allocated": None, "admission": None,
            "admissionChecks": None, "position": None,
            "requeueAt": format_rfc3339(now + delay)}


def rejected_status(message: str, now: float) -> dict[str, Any]:
    return {"phase": "Failed", "message": message, "allocated": None, "conditions": [
        {"type": REJECTED_CONDITION, "status": "True", "reason": "Rejected",
         "message": message[:1024], "lastTransitionTime": format_rfc3339(now)}]}


class CheckStateGauge:
    """`arbiter_admission_check_state{check,state}`: Reserved units counted
    by each of their checks' state, kept up to date unit by unit as the
    store changes (never a walk over every unit)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[str, str], ...]] = {}
        self._counts: Counter[tuple[str, str]] = Counter()

    def update(self, key: str, unit: UnitRecord | None) -> None:
        now = tuple((c.name, c.state) for c in unit.checks) \
            if unit is not None and unit.reserved else ()
        before = self._seen.pop(key, ())
        if now:
            self._seen[key] = now
        if now == before:
            return
        for pair in before:
            self._counts[pair] -= 1
        for pair in now:
            self._counts[pair] += 1
        for check, state in {*before, *now}:
            metrics.admission_check_state.labels(check, state).set(self._counts[(check, state)])
