"""What a unit's consumer is doing, as the cache sees it: a Job's status, a
plain pod's phase and gate, a pod group's members. Pure functions of cache
records."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from arbiter.cache.records import JobRecord, PodRecord


class Consumer(Enum):
    """A unit's consumer as the cache sees it."""

    NONE = "none"  # a reservation: no consumer at all
    MISSING = "missing"  # gone (or replaced by a namesake: other uid)
    HELD = "held"  # suspended / gated: arbiter still holds it
    RELEASED = "released"  # let go, not running yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


def job_state(job: JobRecord | None, uid: str) -> Consumer:
    if job is None or job.uid != uid:  # no uid: not known to be this Job's
        return Consumer.MISSING
    if job.outcome == "Complete":
        return Consumer.SUCCEEDED
    if job.outcome == "Failed":
        return Consumer.FAILED
    if job.suspended:
        return Consumer.HELD
    if job.ready > 0:
        return Consumer.RUNNING
    return Consumer.RELEASED


# job_state for a plain pod: its phase stands for the Job's outcome, its gate for suspend.
def pod_state(pod: PodRecord | None, uid: str) -> Consumer:
    if pod is None or pod.uid != uid:  # no uid: not known to be this Pod's
        return Consumer.MISSING
    if pod.phase == "Succeeded":
        return Consumer.SUCCEEDED
    if pod.phase == "Failed":
        return Consumer.FAILED
    if pod.gated:
        return Consumer.HELD
    if pod.phase == "Running" or pod.node_name:
        return Consumer.RUNNING  # started: bound to a node (or running)
    return Consumer.RELEASED


def group_state(pods: Iterable[PodRecord]) -> Consumer:
    """A group is held while any pod is gated (so an interrupted release is
    finished), running once any pod is bound or runs, finished when all
    have ended."""
    members = list(pods)
    if not members:
        return Consumer.MISSING
    if any(p.gated for p in members):
        return Consumer.HELD
    phases = {p.phase for p in members}
    if phases <= {"Succeeded", "Failed"}:
        return Consumer.FAILED if "Failed" in phases else Consumer.SUCCEEDED
    if phases & {"Running", "Succeeded"} or any(p.node_name for p in members):
        return Consumer.RUNNING
    return Consumer.RELEASED
