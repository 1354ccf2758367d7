"""When an admitted unit that has not started is backed off, and for how long;
when a unit created admitted has its admission written at the latest."""

from __future__ import annotations

from arbiter.cache.ownership import POD_KINDS, WORKLOAD_CONSUMERS
from arbiter.cache.records import UnitRecord
from arbiter.core.api import parse_rfc3339

# While a Job's controller has not taken its release up, its timeout waits,
# up to this many timeouts after admission (a controller that never does).
CONTROLLER_BEHIND = 3
# startTime and creationTimestamp have whole seconds: one written for an
# admission may read up to this long before it.
STAMP_SLACK = 1.0


def admission_deadline(unit: UnitRecord, timeout: float, started: float = 0.0) -> float | None:
    """When an admitted unit whose work has not started goes to backoff: a
    Job with no pod ready, a pod (group) with no pod bound to a node.

    A batch/v1 Job's clock starts when the Job controller took the release up
    (`started`: its status.startTime, set again at every resume), not at
    admission: a control plane minutes behind is not a Job that cannot start,
    and requeueing it only sends its work through that control plane again.
    A controller that never starts the Job still ends it, at
    `CONTROLLER_BEHIND` timeouts.
    """
    if unit.phase != "Dequeued" or unit.consumer is None or unit.consumer.kind not in (
            "Job", *POD_KINDS, *WORKLOAD_CONSUMERS):
        return None
    allocated = parse_rfc3339(unit.last_allocate_time)
    if allocated is None:
        return None
    if unit.consumer.kind != "Job":
        return allocated + timeout
    latest = allocated + CONTROLLER_BEHIND * timeout
    if started >= allocated - STAMP_SLACK:
        return min(latest, started + timeout)
    return latest


def admitted_at(unit: UnitRecord) -> float:
    """From when a pod counts as made for the unit's last admission (0: any pod)."""
    allocated = parse_rfc3339(unit.last_allocate_time)
    return 0.0 if allocated is None else allocated - STAMP_SLACK


def release_deadline(unit: UnitRecord, timeout: float) -> float | None:
    """When a Dequeued Job whose release has not landed goes to backoff: one
    timeout after its admission. The apiserver refuses a Job's new pool
    directives while its status shows the last admission's pods active, and
    only the Job controller changes that: a controller behind would hold
    the unit's room for as long as it is behind."""
    if unit.phase != "Dequeued" or unit.consumer is None or unit.consumer.kind != "Job":
        return None
    allocated = parse_rfc3339(unit.last_allocate_time)
    return None if allocated is None else allocated + timeout


def backoff_delay(attempts: int, *, base: float, cap: float, jitter: float) -> float:
    """Exponential backoff after the `attempts`-th admission timed out;
    `jitter` in [0, 1) spreads it by up to half again."""
    exponent = max(0, attempts - 1)
    delay = min(cap, base * (2.0 ** min(exponent, 32)))
    return delay * (1.0 + 0.5 * jitter)


def record_due(unit: UnitRecord, within: float) -> float:
    """When a unit created admitted (the fast path) has its admission written
    into its status at the latest, if its consumer has not ended by then."""
    return unit.created + within
