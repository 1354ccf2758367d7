"""The side-by-side table of bench/compare_kueue.py (Markdown), printed and, with
`--write-doc`, written into docs/against-kueue.md between its marker comments."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

Json = dict[str, Any]

# Where the latest comparison lives: the table sits between these two lines.
DOC = Path(__file__).resolve().parent.parent / "docs" / "against-kueue.md"
BEGIN = "<!-- compare_kueue: begin"
END = "<!-- compare_kueue: end -->"

# (label, how to read it from one system's result, format, True when lower is better)
ROWS: list[tuple[str, Callable[[Json], float], str, bool]] = [
    ("Jobs created/s (client, 16 in flight)", lambda r: r["throughput"]["created_per_s"],
     "{:.1f}", False),
    ("Jobs admitted before the timeout", lambda r: r["throughput"]["admitted"], "{:.0f}", False),
    ("Jobs admitted/s", lambda r: r["throughput"]["admitted_per_s"], "{:.1f}", False),
    ("creation → admission p50 (s)", lambda r: r["throughput"]["wait_p50"], "{:.2f}", True),
    ("creation → admission p99 (s)", lambda r: r["throughput"]["wait_p99"], "{:.2f}", True),
    ("makespan (s)", lambda r: r["throughput"]["makespan"], "{:.1f}", True),
    ("fairness: time to within one Job of the 3:2:1 share (s)",
     lambda r: r["fairness"]["time_to_fair"], "{:.1f}", True),
    ("fairness: max deviation after that (Jobs)",
     lambda r: r["fairness"]["max_deviation"], "{:.1f}", True),
    ("fairness: preemptions", lambda r: r["fairness"]["preemptions"], "{:.0f}", True),
    ("controller peak RSS (MiB)", lambda r: r["cost"]["peak_rss"] / 2**20, "{:.0f}", True),
    ("controller CPU (s)", lambda r: r["cost"]["cpu_s"], "{:.1f}", True),
    ("apiserver requests on the controller's own API group",
     lambda r: r["cost"]["requests_own_group"], "{:.0f}", True),
    ("apiserver requests, all clients", lambda r: r["cost"]["requests_all"], "{:.0f}", True),
    ("apiserver CPU (s)", lambda r: r["cost"]["apiserver_cpu_s"], "{:.1f}", True),
]


def _cell(value: float, fmt: str) -> str:
    return "n/a" if value is None or math.isnan(value) else fmt.format(value)


def _ratio(ours: float, theirs: float) -> str:
    if any(v is None or math.isnan(v) for v in (ours, theirs)) or theirs == 0:
        return "n/a"
    return f"{ours / theirs:.2f}×"


# Rows that only see the Jobs admitted: a lower bound when some never were.
CENSORED = {"creation → admission p50 (s)", "creation → admission p99 (s)"}


def table(info: Json, results: list[Json], args: argparse.Namespace | None = None) -> str:
    by_name = {r["system"]: r for r in results}
    ours, theirs = by_name.get("kube-arbiter"), by_name.get("Kueue")
    size = vars(args) if args is not None else info.get("args", {})
    lines = [
        f"machine: {info['machine']}",
        f"versions: Kubernetes {info['kubernetes']}, Kueue {info['kueue']}, "
        f"kube-arbiter {info['kube-arbiter']}",
        f"workload: {size.get('jobs', '?')} Jobs over {size.get('tenants', '?')} tenants; "
        f"fairness 3 tenants 3:2:1 on {size.get('nodes', '?')} nodes × "
        f"{size.get('node_cpu', '?')} CPU",
        "",
        "| | kube-arbiter | Kueue | arbiter / Kueue |",
        "|---|---:|---:|---:|",
    ]
    for label, read, fmt, _lower in ROWS:
        values = []
        for result in (ours, theirs):
            try:
                values.append(float(read(result)) if result is not None else float("nan"))
            except (KeyError, TypeError):
                values.append(float("nan"))
        cells = [_cell(v, fmt) for v in values]
        if label in CENSORED:
            for index, result in enumerate((ours, theirs)):
                if result is not None and _unfinished(result):
                    cells[index] = f"> {cells[index]}"
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {_ratio(values[0], values[1])} |")
    for result in results:
        if "error" in result:
            lines.append(f"\n{result['system']} failed: {result['error']}")
        fair = result.get("fairness")
        if fair:
            lines.append(f"\n{result['system']}: running Jobs per tenant at the end "
                         f"{fair['final']} (weighted-DRF share {fair['target']})")
    return "\n".join(lines)


def _unfinished(result: Json) -> bool:
    throughput = result.get("throughput") or {}
    return bool(throughput) and throughput.get("admitted", 0) < throughput.get("jobs", 0)


def print_table(info: Json, results: list[Json], args: argparse.Namespace) -> None:
    print(table(info, results, args))


def write_doc(text: str, doc: Path = DOC) -> None:
    """Put `text` (a `table`) between the markers of `doc`, replacing the
    previous run's; the machine, versions and workload lines become a list."""
    page = doc.read_text()
    start = page.index("\n", page.index(BEGIN)) + 1
    end = page.index(END, start)
    head, _, rest = text.partition("\n\n")
    listed = "\n".join(f"- {line}" for line in head.splitlines())
    doc.write_text(f"{page[:start]}{listed}\n\n{rest.strip()}\n{page[end:]}")


def add_write_doc(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write-doc", nargs="?", const=DOC, type=Path, metavar="FILE",
                        help=f"also write the table into FILE (default {DOC.name} in docs/)")


if __name__ == "__main__":
    # Print the table again from a run's --json file (and, asked, write it).
    import json

    cli = argparse.ArgumentParser(description="the table of a compare_kueue.py --json file")
    cli.add_argument("json", type=Path)
    add_write_doc(cli)
    options = cli.parse_args()
    saved = json.loads(options.json.read_text())
    print(table(saved["info"], saved["results"]))
    if options.write_doc is not None:
        write_doc(table(saved["info"], saved["results"]), options.write_doc)
