"""The HTML of each page, rendered on the server from what the debug API
serves: `queue_views` (Queue status's own summary) for the queues page,
`pending_document` (each unit's place and `explain_unit` reason, the text
its QueueUnit message carries) for a queue's waiting units. No template
engine: every value goes through `html.escape`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from fractions import Fraction
from html import escape
from typing import Any
from urllib.parse import quote

from arbiter.cache.records import QueueRecord
from arbiter.core.engine.flat import dominant_share_of
from arbiter.core.quantities import format_quantity
from arbiter.core.resources import Resources
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.status import QueueView, queue_views, split_key
from arbiter.server.web.access import Visibility

# Waiting and admitted units listed on a queue's page at most.
PAGE_UNITS = 500

_HEAD = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>{title} · kube-arbiter</title><link rel="stylesheet" href="{root}static/view.css">
<script defer src="{root}static/view.js"></script></head>
<body data-events="{root}events"><header><a href="{root}">kube-arbiter</a> · {title}
<nav><a href="{root}">queues</a><a href="{root}pools">pools and nodes</a>\
<a href="{root}decisions">decisions</a></nav>\
<span id="live" class="live" title="live updates">○</span></header><main>
"""
_FOOT = "</main></body></html>\n"


def page(root: str, title: str, body: list[str]) -> str:
    """A whole page: the header, `body`, the footer."""
    return "".join((_HEAD.format(title=escape(title), root=root), *body, _FOOT))


def amount(resource: str, units: int) -> str:
    return format_quantity(resource, units) if units else "0"


def bar(resource: str, allocated: int, deserved: int) -> str:
    """Allocated against deserved: the fill is what it holds, the mark what
    it deserves, both on the larger of the two."""
    scale = max(allocated, deserved, 1)
    over = " over" if allocated > deserved else ""
    return (f'<div class="res"><span class="name">{escape(resource)}</span>'
            f'<span class="bar{over}"><b style="width:{100 * allocated // scale}%"></b>'
            f'<i style="left:{100 * deserved // scale}%"></i></span>'
            f'<span class="num">{amount(resource, allocated)} / '
            f'{amount(resource, deserved)}</span></div>')


def resources_text(resources: Resources) -> str:
    return escape(", ".join(f"{name}={quantity}"
                            for name, quantity in resources.to_quantities().items())) or "—"


def percent(share: Fraction | float) -> str:
    return f"{100 * float(share):.1f}%"


def _tree(views: Mapping[str, QueueView]) -> list[tuple[int, QueueView]]:
    """The queues depth-first under their parents (a queue whose parent is
    not shown is a root), siblings by name."""
    children: dict[str, list[str]] = {}
    roots = []
    for name, view in views.items():
        if view.parent and view.parent in views and view.parent != name:
            children.setdefault(view.parent, []).append(name)
        else:
            roots.append(name)
    out: list[tuple[int, QueueView]] = []
    seen: set[str] = set()
    stack = [(0, name) for name in sorted(roots, reverse=True)]
    while stack:
        depth, name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        out.append((depth, views[name]))
        stack.extend((depth + 1, child) for child in sorted(children.get(name, ()), reverse=True))
    # A cycle (denied, but never lose a queue over one): what is left, flat.
    out.extend((0, views[name]) for name in sorted(views) if name not in seen)
    return out


class QueuesPage:
    """The queues page, kept between requests. On the leader its numbers
    are the views the loop last published (`StatusPublisher.views`, what
    Queue status was written from); elsewhere `queue_views` (the deserved
    water-fill over every queue: tens of milliseconds at a thousand) is
    computed again only when the store changed since (or within `SETTLE`
    seconds before) the last computation, at most every `MIN_AGE` seconds.
    A row's HTML is built again only when its numbers changed. The live
    counts on the page come from the event stream meanwhile."""

    MIN_AGE = 1.0
    SETTLE = 1.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.views: Mapping[str, QueueView] = {}
        self.built = -math.inf
        self.changed = 0.0
        self._rows: dict[str, tuple[object, tuple[Any, ...], tuple[str, str]]] = {}

    def on_change(self, kind: str, key: str) -> None:
        """Store listener."""
        self.changed = self.clock()

    def current(self, mirror: EngineMirror,
                published: Mapping[str, QueueView] | None = None) -> Mapping[str, QueueView]:
        if published:
            return published
        now = self.clock()
        if self.changed >= self.built - self.SETTLE and now - self.built >= self.MIN_AGE:
            # No waiting lists: the counts come from the engine's counters,
            # the order and reasons are a queue's own page.
            self.views = queue_views(mirror, top=0, waiting={})
            self.built = now
        return self.views

    def render(self, root: str, mirror: EngineMirror, visible: Visibility,
               published: Mapping[str, QueueView] | None = None,
               sparkline: Callable[[str], str] = lambda _: "") -> str:
        """`sparkline`: a queue's last hour of share, as inline SVG."""
        views = self.current(mirror, published)
        capacity = mirror.engine.capacity()
        shown = {name: view for name, view in views.items() if visible.queue(name)}
        body = [f'<p class="summary">{len(shown)} queues · capacity {resources_text(capacity)} · '
                f'free {resources_text(mirror.engine.free().clamp_min(0))}</p>',
                '<table class="queues"><thead><tr><th>queue</th><th>weight</th>'
                '<th>guarantee</th><th>capability</th><th>allocated / deserved</th>'
                '<th>share / fair</th><th>last hour</th><th>admitted</th><th>waiting</th>'
                '</tr></thead><tbody>']
        rows: dict[str, tuple[object, tuple[Any, ...], tuple[str, str]]] = {}
        for depth, view in _tree(shown):
            record = mirror.queues.get(view.name)
            key = (depth, capacity, view.allocated, view.deserved, view.dominant_share,
                   view.pending, view.admitted, view.weight, view.state)
            cached = self._rows.get(view.name)
            if cached is None or cached[0] is not record or cached[1] != key:
                cached = (record, key, _row(root, depth, view, record, capacity))
            rows[view.name] = cached
            # The sparkline between the row's two halves: a new sample
            # builds no row again.
            body += (cached[2][0], sparkline(view.name), cached[2][1])
        if len(shown) == len(views):
            self._rows = rows
        else:
            self._rows.update(rows)
        body.append("</tbody></table>")
        return page(root, "Queues", body)


def _row(root: str, depth: int, view: QueueView, record: QueueRecord | None,
         capacity: Resources) -> tuple[str, str]:
    """A queue's row, in two: before and after its sparkline."""
    guarantee = resources_text(record.guarantee) if record else "—"
    capability = resources_text(record.capability) if record else "—"
    names = sorted({*view.allocated, *view.deserved})
    bars = "".join(bar(r, view.allocated.get_amount(r), view.deserved.get_amount(r))
                   for r in names) or "—"
    fair = dominant_share_of(view.deserved, capacity)
    name = escape(view.name)
    closed = ' <span class="closed">closed</span>' if view.state != "Open" else ""
    return (f'<tr data-q="{name}"><td style="padding-left:{0.3 + 1.2 * depth:.1f}em">'
            f'<a href="{root}queues/{quote(view.name, safe="")}">{name}</a>{closed}</td>'
            f'<td>{view.weight}</td><td>{guarantee}</td><td>{capability}</td>'
            f'<td>{bars}</td><td><span data-k="share">{percent(view.dominant_share)}</span>'
            f' / {percent(fair)}</td><td>',
            f'</td><td data-k="admitted">{view.admitted}</td>'
            f'<td data-k="waiting">{view.pending}</td></tr>')


def queue_page(root: str, mirror: EngineMirror, view: QueueView,
               waiting: Mapping[str, Any], admitted: list[tuple[str, str, str]],
               visible: Visibility, messages: Mapping[str, str], chart: str = "") -> str:
    """`waiting`: the debug API's pending document; `admitted`: (key, pool,
    nodes) per admitted unit; `messages`: each unit's QueueUnit status
    message; `chart`: its share over the last hour (SVG)."""
    name = escape(view.name)
    body = [f'<p class="summary" data-q="{name}">weight {view.weight} · allocated '
            f'{resources_text(view.allocated)} · deserved {resources_text(view.deserved)} · share '
            f'<span data-k="share">{percent(view.dominant_share)}</span> · admitted '
            f'<span data-k="admitted">{view.admitted}</span> · waiting '
            f'<span data-k="waiting">{view.pending}</span></p>']
    if waiting.get("reason"):
        body.append(f'<p class="reason">{escape(waiting["reason"])}</p>')
    if chart:
        body.append(f'<h2>Dominant share, last hour</h2>{chart}')
    body.append(f'<h2>Waiting, in admission order ({waiting["total"]})</h2>'
                '<table class="units"><thead><tr><th>#</th><th>unit</th><th>priority</th>'
                '<th>demand</th><th>why it waits</th><th>unit message</th></tr></thead><tbody>')
    for entry in waiting["pending"]:
        unit = unit_link(root, entry["namespace"], entry["name"], visible)
        body.append(
            f'<tr><td>{entry["position"]}</td><td>{unit}</td><td>{entry["priority"]}</td><td>'
            f'{escape(", ".join(f"{k}={v}" for k, v in entry["demand"].items()))}</td>'
            f'<td class="why">{escape(entry["reason"])}</td><td class="message">'
            f'{escape(messages.get(entry["namespace"] + "/" + entry["name"], ""))}</td></tr>')
    body.append(f'</tbody></table><h2>Admitted ({view.admitted})</h2>'
                '<table class="units"><thead><tr><th>unit</th><th>pool</th><th>nodes</th>'
                '</tr></thead><tbody>')
    for key, pool, nodes in admitted:
        namespace, unit = split_key(key)
        body.append(f'<tr><td>{unit_link(root, namespace, unit, visible)}</td>'
                    f'<td>{escape(pool)}</td><td>{escape(nodes)}</td></tr>')
    body.append("</tbody></table>")
    return page(root, f"Queue {view.name}", body)


def unit_link(root: str, namespace: str, name: str, visible: Visibility) -> str:
    """A unit's name, linked to its page; another tenant's unit (in a
    shared queue) shows its place, not its name."""
    if not visible.namespace(namespace):
        return '<span class="other">(another namespace)</span>'
    return (f'<a href="{root}units/{quote(namespace, safe="")}/{quote(name, safe="")}">'
            f'{escape(f"{namespace}/{name}")}</a>')


def queue_link(root: str, name: str) -> str:
    return f'<a href="{root}queues/{quote(name, safe="")}">{escape(name)}</a>'



def admitted_units(mirror: EngineMirror, queue: str,
                   limit: int = PAGE_UNITS) -> list[tuple[str, str, str]]:
    """(key, pool, nodes) of `queue`'s admitted units, by key, at most `limit`."""
    out = []
    for unit in sorted(mirror.engine.admitted(queue), key=lambda u: u.key)[:limit]:
        plan = mirror.plan(unit.key)
        nodes = sorted({node for names in plan.nodes.values() for node in names}) if plan else []
        out.append((unit.key, plan.pool if plan else "", ", ".join(nodes)))
    return out


def login_page(root: str) -> str:
    """What a browser without a token gets (with 401): a form that keeps
    the token in a cookie for this path only."""
    return page(root, "Sign in", [
        '<form id="login"><p>This view needs a Kubernetes token '
        '(<code>kubectl create token NAME</code>): you see the queues of the '
        'namespaces it may read.</p><input type="password" name="token" autocomplete="off" '
        'placeholder="token" required> <button>Open</button></form>'])
