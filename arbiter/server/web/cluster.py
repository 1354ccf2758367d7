"""The pools and nodes page and the decisions page.

Pools: each pool's capacity and what admitted units' plans hold there
(`arbiter.loop.pool_status.pool_views`, what Pool status and the
`arbiter_pool_*` metrics are written from), and a grid of the engine's
nodes (its node model: allocatable less what is free to plan, which
counts both plans and pods no plan covers), coloured by each node's most
used resource. A tenant sees the pools and the grid, not the node names.

Decisions: the last ones this replica's loop carried out
(`arbiter.loop.decisions.RECENT`), newest first, of the queues the caller
sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape

from arbiter.core.api import format_rfc3339
from arbiter.loop.decisions import Recorded
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.pool_status import PoolView
from arbiter.loop.status import split_key
from arbiter.server.web.access import Visibility
from arbiter.server.web.pages import bar, page, queue_link, resources_text, unit_link

# Nodes drawn in the grid at most; decisions listed by default and at most.
MAX_NODES = 10_000
DECISIONS = 200
# Use in fifths: the colour classes of a node (u0 .. u5, u5 = full).
LEVELS = 5


def node_use(mirror: EngineMirror) -> list[tuple[str, str, float, str]]:
    """(name, pool, use, what it holds) of each node the engine places
    on, by pool then name; use in [0, 1] is the most used resource's."""
    view = mirror.engine.node_view()
    if view is None:
        return []
    index = view.index
    out = []
    for g, node in enumerate(index.nodes[:MAX_NODES]):
        named = [(name, amount) for name, amount in node.allocatable.items() if amount]
        use, parts = 0.0, []
        for (name, amount), (i, _) in zip(named, view.pairs(node.allocatable), strict=True):
            used = max(0, amount - index.free[i][g])
            use = max(use, used / amount)
            parts.append(f"{name} {used * 100 // amount}%")
        out.append((node.name, index.pool_of[g], use, ", ".join(parts)))
    return sorted(out, key=lambda entry: (entry[1], entry[0]))


def pools_page(root: str, pools: Mapping[str, PoolView],
               nodes: list[tuple[str, str, float, str]], visible: Visibility) -> str:
    body = ['<table class="pools"><thead><tr><th>pool</th><th>nodes</th><th>capacity</th>'
            '<th>allocated / capacity</th></tr></thead><tbody>']
    for view in pools.values():
        bars = "".join(bar(r, view.allocated.get_amount(r), view.capacity.get_amount(r))
                       for r in sorted(view.capacity)) or "—"
        body.append(f'<tr data-pool="{escape(view.name)}"><td>{escape(view.name)}</td>'
                    f'<td>{view.nodes}</td><td>{resources_text(view.capacity)}</td>'
                    f'<td>{bars}</td></tr>')
    body.append("</tbody></table>")
    if not nodes:
        body.append('<p class="summary">no nodes: the engine fits on the cluster total</p>')
    pool = None
    for number, (name, in_pool, use, holds) in enumerate(nodes):
        if in_pool != pool:
            if pool is not None:
                body.append("</div>")
            pool = in_pool
            body.append(f'<h2>Nodes of pool {escape(pool)}</h2><div class="grid">')
        level = min(LEVELS, int(use * LEVELS))
        label = name if visible.everything else f"node {number + 1}"
        body.append(f'<span class="node u{level}" title="{escape(label)}: {escape(holds)}">'
                    f'</span>')
    if pool is not None:
        body.append("</div>")
    body.append('<p class="legend">' + "".join(
        f'<span class="node u{level}"></span> {100 * level // LEVELS}%'
        + (" and over" if level == LEVELS else f"–{100 * (level + 1) // LEVELS}%")
        + " " for level in range(LEVELS + 1)) + "of the most used resource</p>")
    return page(root, "Pools and nodes", body)


def decisions_page(root: str, decisions: Iterable[Recorded], visible: Visibility,
                   limit: int = DECISIONS, queue: str = "") -> str:
    # Releases follow every admission: the unit's timeline shows them, not this list.
    shown = [d for d in reversed(list(decisions)) if d.decision != "release"
             and visible.queue(d.queue) and (not queue or d.queue == queue)][:limit]
    body = [f'<p class="summary">the last {len(shown)} decisions of this replica'
            + (f" in queue {queue_link(root, queue)}" if queue else "") + ", newest first</p>",
            '<table class="decisions"><thead><tr><th>when (UTC)</th><th>decision</th>'
            '<th>queue</th><th>unit</th><th>reason</th><th>detail</th></tr></thead><tbody>']
    for decision in shown:
        namespace, name = split_key(decision.unit)
        fields = dict(decision.fields)
        target = fields.pop("for_unit", "")
        detail = [escape(f"{k}={v}") for k, v in fields.items() if k != "for_queue"]
        if "for_queue" in fields:
            detail.insert(0, "for " + queue_link(root, fields["for_queue"]))
        if target:
            detail.insert(1, unit_link(root, *split_key(target), visible))
        body.append(f'<tr class="{escape(decision.decision)}"><td>{format_rfc3339(decision.at)}'
                    f'</td><td>{escape(decision.decision)}</td>'
                    f'<td>{queue_link(root, decision.queue)}</td>'
                    f'<td>{unit_link(root, namespace, name, visible)}</td>'
                    f'<td>{escape(decision.reason)}</td><td>{" · ".join(detail)}</td></tr>')
    body.append("</tbody></table>")
    return page(root, "Decisions", body)
