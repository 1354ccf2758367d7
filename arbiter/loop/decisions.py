"""One structured log line per decision the loop carries out: a unit
admitted, backed off, requeued, or its pods evicted. Each line carries
`decision`, `queue`, `unit` (namespace/name), `reason` and the unit's
`resources` (its demand, as Kubernetes quantities), plus what the decision
adds (the attempt, the queue a reclaim was for). The server's JSON formatter
(`arbiter.cli.serve.JsonFormatter`) prints these fields as they are, so one
decision is one JSON object a log pipeline can filter by queue or unit.

A decision is logged once its write succeeded (a refused or failed write
decided nothing), from the one place that carries it out.
"""

from __future__ import annotations

import logging
from typing import Literal

from arbiter.cache.records import UnitRecord

log = logging.getLogger("arbiter.decisions")

# "hold": a starving unit reclaim does not serve, and why (arbiter.loop.reclaim).
Decision = Literal["admit", "reserve", "reject", "backoff", "requeue", "evict", "hold"]


def log_decision(decision: Decision, unit: UnitRecord, reason: str, *,
                 level: int = logging.INFO, **fields: object) -> None:
    """Log one decision about `unit` (extra `fields` must not shadow a
    LogRecord attribute: `name`, `msg`, `args`, ...)."""
    log.log(level, "%s %s", decision, unit.key, extra={
        "decision": decision, "queue": unit.queue, "unit": unit.key, "reason": reason,
        "resources": unit.demand.to_quantities(), **fields,
    })
