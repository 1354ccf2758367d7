"""One structured log line per decision the loop carries out: a unit
admitted, backed off, requeued, or its pods evicted. Each line carries
`decision`, `queue`, `unit` (namespace/name), `reason` and the unit's
`resources` (its demand, as Kubernetes quantities), plus what the decision
adds (the attempt, the queue a reclaim was for). The server's JSON formatter
(`arbiter.cli.serve.JsonFormatter`) prints these fields as they are, so one
decision is one JSON object a log pipeline can filter by queue or unit.

A decision is logged once its write succeeded (a refused or failed write
decided nothing), from the one place that carries it out. The last `KEPT`
are also kept in memory (`RECENT`), for the web view's decisions and unit
pages (`arbiter.server.web`): this process's own, so a replica that does
not lead has none.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from arbiter.cache.records import UnitRecord

log = logging.getLogger("arbiter.decisions")

# "hold": a starving unit reclaim does not serve, and why (arbiter.loop.reclaim).
Decision = Literal["admit", "reserve", "reject", "backoff", "requeue", "evict", "hold",
                   "release"]


# Decisions kept in memory at most (a few hundred bytes each).
KEPT = 2000


@dataclass(frozen=True, slots=True)
class Recorded:
    """One decision as the web view shows it (`fields` as text)."""

    at: float  # epoch seconds
    decision: Decision
    queue: str
    unit: str  # namespace/name
    reason: str
    fields: tuple[tuple[str, str], ...] = ()


RECENT: deque[Recorded] = deque(maxlen=KEPT)


def log_decision(decision: Decision, unit: UnitRecord, reason: str, *,
                 level: int = logging.INFO, **fields: object) -> None:
    """Log one decision about `unit` (extra `fields` must not shadow a
    LogRecord attribute: `name`, `msg`, `args`, ...)."""
    log.log(level, "%s %s", decision, unit.key, extra={
        "decision": decision, "queue": unit.queue, "unit": unit.key, "reason": reason,
        "resources": unit.demand.to_quantities(), **fields,
    })
    RECENT.append(Recorded(time.time(), decision, unit.queue, unit.key, reason,
                           tuple((key, str(value)) for key, value in fields.items())))


def remember(decision: Decision, unit: UnitRecord, reason: str) -> None:
    """Keep a step of a unit in `RECENT` only (the web view's timeline), not
    in the log: a release follows every admission, which the log says."""
    RECENT.append(Recorded(time.time(), decision, unit.queue, unit.key, reason))
