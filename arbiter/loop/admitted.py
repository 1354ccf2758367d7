"""The status an admission writes into its QueueUnit: one more entry in
`admissions`, the phase (Dequeued, or Reserved while admission checks run),
what is allocated and where. Built here for the loop's admissions
(`Actions.admit`) and for units created admitted (the fast path)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from arbiter.cache.records import UnitAdmission, UnitRecord
from arbiter.core.api import format_rfc3339
from arbiter.core.model import Placement, demand_of
from arbiter.loop.checks import pending_checks_status


def admission_status(
    unit: UnitRecord, current: Mapping[str, Any] | None, now: float, by: str = "",
    plan: Placement | None = None, *, checks: Sequence[str] = (),
    replicas: Mapping[str, int] | None = None, members: Sequence[str] = (),
) -> dict[str, Any]:
    """Status of a unit being admitted: one more admission, attempt n+1
    (`by`: the identity of the leader that admitted it; `plan`: where its
    pods go, recorded as `admission`, or null when admitted without one).
    With `checks` its quota is only reserved: phase Reserved, each check
    Pending (DESIGN §12). `replicas`: pods per pod set when fewer than asked
    were admitted (partial admission). `members`: a pod group's pods admitted
    (status.admittedPods: only they are released and charged to it)."""
    current = current or {}
    stamp = format_rfc3339(now)
    attempt = int(current.get("attempts") or unit.attempts or 0) + 1
    admissions = list(current.get("admissions") or [])
    entry: dict[str, Any] = {"time": stamp, "queue": unit.queue, "attempt": attempt}
    if by:
        entry["by"] = by
    allocated = unit.demand
    if replicas:
        entry["replicas"] = dict(replicas)
        allocated = demand_of(replace(unit, replicas=tuple(sorted(replicas.items())))
                              .admitted_pod_sets)
    admissions.append(entry)
    where = f" into pool {plan.pool}" if plan is not None else ""
    status: dict[str, Any] = {
        "phase": "Dequeued",
        "admissions": admissions,
        "attempts": attempt,
        "lastAllocateTime": stamp,
        "allocated": allocated.to_quantities(),
        "message": f"admitted by queue {unit.queue}{where}",
        "position": None,
        "admission": UnitAdmission.from_placement(plan).to_api() if plan is not None else None,
        "requeueAt": None,
    }
    if members:
        status["admittedPods"] = list(members)
    if checks:
        status["phase"] = "Reserved"
        status["admissionChecks"] = pending_checks_status(checks, now)
        status["message"] = (f"quota reserved by queue {unit.queue}{where}; waiting on "
                             f"admission checks: {', '.join(checks)}")
    return status
