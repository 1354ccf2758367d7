"""`arbiter queues`: every Queue's fair share, as one table, for any cluster.

Reads what the admission loop writes into each Queue's status (allocated,
deserved, dominantShare, admitted, pending) and the nodes' allocatable (for
the deserved share, i.e. the dominant share of the deserved resources).
`arbiter demo` draws the same table live. The SHARE column is a bar filled to
the dominant share with a marker at the deserved share, then both numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import config as kube_config

from arbiter.base.kubeapi import ApiError, request_json
from arbiter.cache.convert import ConversionError, node_from_api
from arbiter.core.api import QUEUE, QUEUE_UNIT, parse_rfc3339
from arbiter.core.quantities import QuantityError, format_quantity
from arbiter.core.resources import EMPTY, Resources

QUEUES_PATH = QUEUE.path
NODES_PATH = "/api/v1/nodes"
SHARE_BAR = 20
PROGRESS_BAR = 12
# Short names for the resource columns; others are shown by their own name.
SHORT_NAMES = {"memory": "mem", "nvidia.com/gpu": "gpu", "ephemeral-storage": "disk"}
# Resources listed first, in this order.
RESOURCE_ORDER = ("cpu", "memory", "nvidia.com/gpu")


@dataclass(frozen=True, slots=True)
class Glyphs:
    full: str
    partial: tuple[str, ...]  # eighths: 1/8 .. 7/8
    empty: str
    marker: str
    done: str
    todo: str
    spark: str


UNICODE = Glyphs(full="█", partial=("▏", "▎", "▍", "▌", "▋", "▊", "▉"), empty=" ",
                 marker="│", done="█", todo="░", spark="▁▂▃▄▅▆▇█")
ASCII = Glyphs(full="#", partial=(), empty=" ", marker="|", done="#", todo=".",
               spark="_.-=^")


def glyphs_for(stream: Any) -> Glyphs:
    """Unicode blocks when the stream can encode them, else ASCII."""
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        (UNICODE.full + UNICODE.marker + UNICODE.todo + "".join(UNICODE.partial)
         + UNICODE.spark).encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return ASCII
    return UNICODE


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    weight: int
    state: str
    guarantee: Resources
    allocated: Resources
    deserved: Resources
    # status.dominantShare: max over resources of allocated / capacity.
    share: float
    # The dominant share of `deserved` (None when capacity is unknown).
    deserved_share: float | None
    admitted: int
    pending: int
    # (done, total) for the progress bar; default (admitted, admitted + pending).
    progress: tuple[int, int] | None = None
    # Recent shares, oldest first (the demo's sparkline).
    history: tuple[float, ...] = ()
    parent: str = ""  # spec.parent (DESIGN §11): the table shows the tree
    # status.unqueued / unqueuedPods: bound pods no admitted unit covers (DESIGN §13).
    unqueued: Resources = EMPTY
    unqueued_pods: int = 0

    @property
    def bar_counts(self) -> tuple[int, int]:
        if self.progress is not None:
            return self.progress
        return self.admitted, self.admitted + self.pending


def _resources(value: Any) -> Resources:
    try:
        return Resources.parse(value if isinstance(value, Mapping) else None)
    except QuantityError:
        return EMPTY


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def dominant_share(amounts: Mapping[str, int], capacity: Mapping[str, int]) -> float:
    """max over resources of amount / capacity (resources with no capacity ignored)."""
    shares = [amount / capacity[name] for name, amount in amounts.items()
              if capacity.get(name, 0) > 0]
    return max(shares, default=0.0)


def capacity_of(nodes: Iterable[Mapping[str, Any]]) -> Resources:
    """Allocatable of the Ready, schedulable nodes, summed (as the cache reads a Node)."""
    total = EMPTY
    for obj in nodes:
        try:
            node = node_from_api(obj)
        except ConversionError:  # an allocatable that does not parse counts as none
            continue
        if node.ready and node.schedulable:
            total = total + node.allocatable
    return total


def queue_row(obj: Mapping[str, Any], capacity: Resources | None) -> QueueRow:
    """One table row from a Queue object."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    deserved = _resources(status.get("deserved"))
    allocated = _resources(status.get("allocated"))
    share = _float(status.get("dominantShare")) if "dominantShare" in status else (
        dominant_share(allocated, capacity) if capacity else 0.0)
    return QueueRow(
        name=str((obj.get("metadata") or {}).get("name", "")),
        weight=_int(spec.get("weight", 1)) or 1,
        state=str(spec.get("state") or "Open"),
        guarantee=_resources(spec.get("guarantee")),
        allocated=allocated,
        deserved=deserved,
        share=share,
        deserved_share=dominant_share(deserved, capacity) if capacity else None,
        admitted=_int(status.get("admitted")),
        pending=_int(status.get("pending")),
        parent=str(spec.get("parent") or ""),
        unqueued=_resources(status.get("unqueued")),
        unqueued_pods=_int(status.get("unqueuedPods")),
    )


# -- rendering -------------------------------------------------------------------------
def format_resources(resources: Mapping[str, int]) -> str:
    """"cpu 3, mem 12Gi" (cpu and memory first), or "-" when empty."""
    names = [n for n in RESOURCE_ORDER if n in resources]
    names += sorted(n for n in resources if n not in RESOURCE_ORDER)
    parts = [f"{SHORT_NAMES.get(n, n)} {format_quantity(n, resources[n])}"
             for n in names if resources[n]]
    return ", ".join(parts) or "-"


def share_bar(share: float, deserved: float | None, glyphs: Glyphs,
              width: int = SHARE_BAR) -> str:
    """A bar `width` cells wide, filled to `share`, with a marker at `deserved`."""
    eighths = round(min(max(share, 0.0), 1.0) * width * 8)
    full, rest = divmod(eighths, 8)
    cells = [glyphs.full] * full
    if rest and full < width:
        cells.append(glyphs.partial[rest - 1] if glyphs.partial
                     else glyphs.full if rest >= 4 else glyphs.empty)
    cells += [glyphs.empty] * (width - len(cells))
    if deserved is not None:
        cells[min(width - 1, round(min(max(deserved, 0.0), 1.0) * width))] = glyphs.marker
    return "".join(cells)


def progress_bar(done: int, total: int, glyphs: Glyphs, width: int = PROGRESS_BAR) -> str:
    filled = 0 if total <= 0 else min(width, round(width * done / total))
    return glyphs.done * filled + glyphs.todo * (width - filled)


def sparkline(values: Sequence[float], glyphs: Glyphs, width: int = 16) -> str:
    """Recent values on a 0..1 scale, one character each (the last `width`)."""
    levels = glyphs.spark
    recent = list(values)[-width:]
    return "".join(levels[min(len(levels) - 1, max(0, round(v * (len(levels) - 1))))]
                   for v in recent)


def _share_text(row: QueueRow) -> str:
    deserved = "  -  " if row.deserved_share is None else f"{row.deserved_share:.2f}"
    return f"{row.share:.2f} / {deserved}"


def render_table(rows: Sequence[QueueRow], glyphs: Glyphs = UNICODE) -> str:
    """The table, one line per queue, columns aligned; a legend below."""
    if not rows:
        return "No queues.\n"
    with_history = any(row.history for row in rows)
    headers = ["QUEUE", "WEIGHT", "GUARANTEE", "ALLOCATED", "DESERVED",
               f"SHARE ({glyphs.full} now {glyphs.marker} deserved)", "NOW / DESERVED",
               "ADMITTED", "PENDING"]
    if with_history:
        headers.insert(7, "SHARE OVER TIME")
    # Shown when some queue has any: pods running outside any unit.
    with_unqueued = any(row.unqueued_pods for row in rows)
    if with_unqueued:
        headers.append("UNQUEUED")
    table: list[list[str]] = []
    for depth, row in tree_order(rows):
        done, total = row.bar_counts
        name = row.name if row.state == "Open" else f"{row.name} ({row.state})"
        name = "  " * depth + name
        cells = [
            name,
            str(row.weight),
            format_resources(row.guarantee),
            format_resources(row.allocated),
            format_resources(row.deserved),
            share_bar(row.share, row.deserved_share, glyphs),
            _share_text(row),
            f"{progress_bar(done, total, glyphs)} {done}/{total}",
            str(row.pending),
        ]
        if with_history:
            cells.insert(7, sparkline(row.history, glyphs))
        if with_unqueued:
            cells.append(f"{row.unqueued_pods} pods: {format_resources(row.unqueued)}"
                         if row.unqueued_pods else "-")
        table.append(cells)
    widths = [max(len(line[i]) for line in [headers, *table]) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
             .rstrip() for line in [headers, *table]]
    return "\n".join(lines) + "\n"


def render_reserved(units: Iterable[Mapping[str, Any]], now: float) -> str:
    """Units holding quota while they wait on admission checks (DESIGN §12):
    one line each, with every check's state and how long it has been so."""
    lines = []
    for unit in units:
        meta, status = unit.get("metadata") or {}, unit.get("status") or {}
        if status.get("phase") != "Reserved" or not status.get("admissionChecks"):
            continue
        checks = []
        for check in status["admissionChecks"]:
            since = parse_rfc3339(check.get("lastTransitionTime"))
            age = f" {int(max(0.0, now - since))}s" if since is not None else ""
            checks.append(f"{check.get('name')}={check.get('state')}{age}")
        lines.append(f"  {meta.get('namespace')}/{meta.get('name')}  queue "
                     f"{(unit.get('spec') or {}).get('queue')}  {'  '.join(checks)}")
    if not lines:
        return ""
    return "\nWaiting on admission checks (quota reserved):\n" + "\n".join(sorted(lines)) + "\n"


def tree_order(rows: Sequence[QueueRow]) -> list[tuple[int, QueueRow]]:
    """(depth, row) depth first, siblings by name: each queue under its parent.
    A queue whose parent is not listed (or is in a cycle) is shown at the top."""
    names = {row.name for row in rows}
    children: dict[str, list[QueueRow]] = {}
    for row in rows:
        children.setdefault(row.parent if row.parent in names else "", []).append(row)
    out: list[tuple[int, QueueRow]] = []
    shown: set[str] = set()

    def walk(parent: str, depth: int) -> None:
        for row in sorted(children.get(parent, []), key=lambda r: r.name):
            if row.name not in shown:
                shown.add(row.name)
                out.append((depth, row))
                walk(row.name, depth + 1)

    walk("", 0)
    for row in sorted(rows, key=lambda r: r.name):  # cycles: not reachable from the top
        if row.name not in shown:
            shown.add(row.name)
            out.append((0, row))
            walk(row.name, 1)
    return out


# -- I/O ------------------------------------------------------------------------------------
async def fetch_rows(api: Any, *, label_selector: str | None = None) -> list[QueueRow]:
    """Queues (optionally by label) and the cluster's capacity, as rows."""
    query = [("labelSelector", label_selector)] if label_selector else []
    queues = await request_json(api, "GET", QUEUES_PATH, query=query)
    capacity: Resources | None
    try:
        nodes = await request_json(api, "GET", NODES_PATH)
        capacity = capacity_of(nodes.get("items") or [])
    except ApiError:
        capacity = None  # not allowed to list nodes: no deserved share
    return [queue_row(item, capacity or None) for item in queues.get("items") or []]


async def fetch_reserved(api: Any) -> list[Mapping[str, Any]]:
    """Reserved QueueUnits (by field selector where the CRD allows it);
    none when they may not be listed."""
    try:
        listed = await request_json(api, "GET", QUEUE_UNIT.path,
                                    query=[("fieldSelector", "status.phase=Reserved")])
    except ApiError:
        return []
    return list(listed.get("items") or [])


async def _load(kubeconfig: Path | None) -> tuple[list[QueueRow], list[Mapping[str, Any]]]:
    client = await kube_config.new_client_from_config(
        config_file=str(kubeconfig) if kubeconfig else None, persist_config=False)
    async with client:
        return await fetch_rows(client), await fetch_reserved(client)


# `arbiter queues` and its flags (cli/main.py calls each command's add_parser).
def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "queues",
        help="print every Queue's allocated vs deserved share",
        description="Print every Queue's weight, guarantee, allocated and deserved "
                    "resources, dominant share against its deserved share, admitted "
                    "and pending units (from the Queues' status, written by the "
                    "admission loop).",
    )
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        rows, reserved = asyncio.run(_load(args.kubeconfig))
    except ApiError as error:
        print(f"arbiter queues: {error}", file=sys.stderr)
        return 1
    except (OSError, ValueError, kube_config.ConfigException) as error:
        print(f"arbiter queues: cannot reach the cluster: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(render_table(rows, glyphs_for(sys.stdout)))
    sys.stdout.write(render_reserved(reserved, time.time()))
    return 0
