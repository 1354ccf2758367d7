"""A unit's page (`/view/units/{namespace}/{name}`): its state now (phase,
message, why it waits, its pods on nodes), its timeline, its pod sets and
its plan.

The timeline is put together from what the loop wrote and did: the
QueueUnit's status read from the apiserver (each admission with its time,
queue, attempt and leader; its conditions with their transition times;
lastAllocateTime), its creation time from the cache, and this replica's
recent decisions (`arbiter.loop.decisions.RECENT`): requeued, backed off,
taken back and for whom, and the units it took back itself. Without the
apiserver's copy (no client, or the read failed) the cache's record says
the rest. Anything read from the status is checked before it is shown:
a field of the wrong type is left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

from arbiter.cache.records import UnitRecord
from arbiter.core.api import format_rfc3339, parse_rfc3339
from arbiter.loop.decisions import Recorded
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.status import split_key
from arbiter.server.web.access import Visibility
from arbiter.server.web.pages import page, queue_link, resources_text, unit_link

# Decisions about one unit shown at most.
MAX_EVENTS = 200


@dataclass(frozen=True, slots=True)
class Moment:
    at: float | None  # epoch seconds (None: when is not known)
    what: str
    detail: str = ""  # HTML


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _from_status(status: Mapping[str, Any]) -> list[Moment]:
    out: list[Moment] = []
    admissions = status.get("admissions")
    for entry in admissions if isinstance(admissions, list) else []:
        if not isinstance(entry, Mapping):
            continue
        by = _text(entry.get("by"))
        attempt = entry.get("attempt")
        detail = (f"attempt {attempt} · queue {escape(_text(entry.get('queue')))}"
                  if isinstance(attempt, int) else escape(_text(entry.get("queue"))))
        replicas = entry.get("replicas")
        if isinstance(replicas, Mapping) and replicas:
            detail += " · partial: " + escape(", ".join(f"{k}={v}" for k, v in replicas.items()))
        if by:
            detail += f" · by {escape(by)}"
        out.append(Moment(parse_rfc3339(_text(entry.get("time"))), "quota taken", detail))
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if not isinstance(condition, Mapping):
            continue
        what = f"{_text(condition.get('type'))}={_text(condition.get('status'))}"
        detail = " · ".join(escape(part) for part in (
            _text(condition.get("reason")), _text(condition.get("message"))) if part)
        out.append(Moment(parse_rfc3339(_text(condition.get("lastTransitionTime"))),
                          f"condition {what}", detail))
    requeue_at = status.get("requeueAt")
    if isinstance(requeue_at, str):
        out.append(Moment(parse_rfc3339(requeue_at), "waits until then to be requeued"))
    return out


_DECIDED = {"admit": "admitted", "reserve": "quota reserved", "reject": "rejected",
            "backoff": "backed off", "requeue": "requeued", "evict": "taken back",
            "hold": "not reclaiming", "release": "released"}


def _from_decisions(root: str, key: str, decisions: Iterable[Recorded],
                    visible: Visibility) -> list[Moment]:
    out: list[Moment] = []
    for decision in decisions:
        fields = dict(decision.fields)
        if decision.unit == key:
            what = _DECIDED.get(decision.decision, decision.decision)
            detail = escape(decision.reason)
            if "for_queue" in fields:
                what = f"{what} ({escape(fields.get('cause', 'reclaim'))})"
                namespace, name = split_key(fields.get("for_unit", ""))
                detail += (f" · for queue {queue_link(root, fields['for_queue'])}"
                           + (f", unit {unit_link(root, namespace, name, visible)}"
                              if name else ""))
            out.append(Moment(decision.at, what, detail))
        elif fields.get("for_unit") == key:
            namespace, name = split_key(decision.unit)
            out.append(Moment(decision.at, f"took back ({escape(fields.get('cause', ''))})",
                              f"{unit_link(root, namespace, name, visible)} of queue "
                              f"{queue_link(root, decision.queue)}"))
    return out[-MAX_EVENTS:]


def timeline(root: str, record: UnitRecord, status: Mapping[str, Any] | None,
             decisions: Iterable[Recorded], visible: Visibility) -> list[Moment]:
    """Everything known to have happened to the unit, oldest first (what has
    no time last)."""
    moments = [Moment(record.created or None, "created", f"in queue {escape(record.queue)}")]
    if status is not None:
        moments += _from_status(status)
    elif record.last_allocate_time:
        moments.append(Moment(parse_rfc3339(record.last_allocate_time), "quota taken",
                              f"the latest of {record.admissions} admissions"))
    moments += _from_decisions(root, record.key, decisions, visible)
    if record.phase in ("Succeed", "Failed") and not any(
            m.what.startswith("condition") for m in moments):
        moments.append(Moment(None, f"finished: {record.phase}", escape(record.message)))
    return sorted(moments, key=lambda m: (m.at is None, m.at or 0.0))


def unit_page(root: str, record: UnitRecord, mirror: EngineMirror,
              status: Mapping[str, Any] | None, decisions: Iterable[Recorded],
              visible: Visibility) -> str:
    key = record.key
    engine = mirror.engine
    why = engine.explain_unit(key) if engine.is_pending(key) else ""
    bound = mirror.nodes.bound_nodes(key)
    consumer = record.consumer
    rows = [("queue", queue_link(root, record.queue)), ("phase", escape(record.phase)),
            ("priority", str(record.priority)), ("message", escape(record.message)),
            ("why it waits", escape(why)),
            ("position", "" if record.position is None else str(record.position)),
            ("attempts", str(record.attempts)),
            ("consumer", escape(f"{consumer.kind} {consumer.name}") if consumer
             else "none (a reservation)"),
            ("pods running", f"{len(bound)} on {escape(', '.join(sorted(set(bound))))}"
             if bound else "0")]
    body = ['<table class="facts"><tbody>']
    body += [f'<tr><th>{name}</th><td class="{name.replace(" ", "-")}">{value}</td></tr>'
             for name, value in rows if value]
    body.append('</tbody></table><h2>Timeline</h2><table class="timeline"><thead><tr>'
                '<th>when (UTC)</th><th>what</th><th>detail</th></tr></thead><tbody>')
    for moment in timeline(root, record, status, decisions, visible):
        when = format_rfc3339(moment.at) if moment.at is not None else "—"
        body.append(f'<tr><td>{when}</td><td class="what">{escape(moment.what)}</td>'
                    f'<td>{moment.detail}</td></tr>')
    body.append('</tbody></table><h2>Pod sets</h2><table class="units"><thead><tr><th>name</th>'
                '<th>pods</th><th>at least</th><th>admitted</th><th>each asks</th>'
                '</tr></thead><tbody>')
    admitted = dict(record.replicas)
    for pod_set in record.pod_sets:
        count = admitted.get(pod_set.name, pod_set.count) if record.admitted else ""
        body.append(f'<tr><td>{escape(pod_set.name)}</td><td>{pod_set.count}</td>'
                    f'<td>{pod_set.min_count or pod_set.count}</td><td>{count}</td>'
                    f'<td>{resources_text(pod_set.requests)}</td></tr>')
    body.append("</tbody></table>")
    body += _plan(record, mirror)
    return page(root, f"Unit {key}", body)


def _plan(record: UnitRecord, mirror: EngineMirror) -> list[str]:
    """Where its pods go: status.admission, else the engine's plan."""
    placement = record.admission.placement() if record.admission is not None \
        else mirror.plan(record.key)
    if placement is None:
        return ['<h2>Plan</h2><p class="plan">none: not admitted, or admitted without '
                'node fit</p>']
    out = [f'<h2>Plan</h2><p class="plan">pool <b>{escape(placement.pool)}</b></p>'
           '<table class="units"><thead><tr><th>pod set</th><th>nodes, a pod each</th>'
           '</tr></thead><tbody>']
    out += [f'<tr><td>{escape(name)}</td><td>{escape(", ".join(nodes))}</td></tr>'
            for name, nodes in sorted(placement.nodes.items())]
    out.append("</tbody></table>")
    return out
