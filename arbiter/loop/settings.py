"""The admission loop's settings, and what it has done so far."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoopSettings:
    overcommit: float = 1.0
    admission_timeout: float = 300.0
    backoff_base: float = 10.0
    backoff_max: float = 600.0
    debounce: float = 0.005
    # After a cycle of D seconds the loop gives the event loop at least
    # `cycle_rest` x D (at most 1 s) before the next: a cycle is one
    # synchronous stretch, O(units) at worst, and back to back under a flood
    # they starve the webhooks and the Lease renewal sharing the loop.
    cycle_rest: float = 1.0
    # API writes in flight at once. Each admission is three sequential
    # writes (unit, status, release); under a slow apiserver (~0.3 s a call)
    # 32 capped the loop at ~30 admissions/s, 128 kept up with creation.
    max_writes: int = 100
    resync_interval: float = 600.0
    # Consumers + units one cycle looks at before yielding the event loop.
    batch: int = 500
    # A replica that does not lead keeps the engine warm (arbiter.loop.standby).
    warm_standby: bool = True
    retry_base: float = 1.0
    retry_max: float = 60.0
    # Status writes: one object at most once per interval, all together
    # under `status_qps` a second.
    status_interval: float = 2.0
    status_qps: float = 20.0
    # Waiting events go to the first units of each queue only, and positions
    # are kept up to date for the first `position_depth` (beyond, a unit's
    # position is not written: at 100,000 waiting units it would be a write
    # storm for a number nobody acts on).
    waiting_event_depth: int = 100
    position_depth: int = 1000
    # Seconds a queue starves below its deserved share before it reclaims
    # (arbiter.loop.reclaim).
    reclaim_grace: float = 30.0
    # Seconds PodDisruptionBudgets may block a reclaim before pods are deleted.
    reclaim_pdb_timeout: float = 300.0
    # Admission at creation (DESIGN §16, arbiter.loop.fastpath): the leader's
    # webhook lets a Job through admitted when it would be the next admitted.
    admit_on_create: bool = True
    # A unit created admitted carries its admission in an annotation; its
    # status is written once, with the phase its consumer reached, when the
    # consumer ends or this many seconds after the unit's creation: a short
    # Job costs its unit one status write in all, not three (admission,
    # Running, Succeed). Until then `kubectl get queueunits` shows no phase.
    record_within: float = 60.0
    # Tests only (the e2e kill between the webhook's answer and the unit's
    # write): seconds the write of a unit admitted at creation waits.
    fast_unit_delay: float = 0.0

    def rest_after(self, cycle: float) -> float:
        """How long others get the event loop after a cycle of `cycle` s."""
        return min(1.0, max(0.0, self.cycle_rest * cycle))


# What the loop has done so far (cycles, admissions, writes), for tests and logs.
@dataclass(slots=True)
class CycleStats:
    cycles: int = 0
    admitted: int = 0
    last_duration: float = 0.0
    created: int = 0
    writes_failed: int = 0
