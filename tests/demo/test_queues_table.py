"""`arbiter queues`: rows from Queue objects and the table's formatting."""

from __future__ import annotations

import io
from typing import Any

from arbiter.cli.queues import (
    ASCII,
    UNICODE,
    QueueRow,
    capacity_of,
    dominant_share,
    format_resources,
    glyphs_for,
    progress_bar,
    queue_row,
    render_reserved,
    render_table,
    share_bar,
    sparkline,
)
from arbiter.core.resources import Resources

CAPACITY = Resources.parse({"cpu": "32", "memory": "128Gi"})


def _node(cpu: str, memory: str, *, ready: bool = True, unschedulable: bool = False
          ) -> dict[str, Any]:
    return {"spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "conditions": [{"type": "Ready",
                                       "status": "True" if ready else "False"}]}}


def _queue(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"weight": 3, "guarantee": {"cpu": "8"}},
            "status": status}


def test_capacity_counts_ready_schedulable_nodes_only() -> None:
    nodes = [_node("4", "16Gi"), _node("4", "16Gi"), _node("8", "32Gi", ready=False),
             _node("8", "32Gi", unschedulable=True)]
    assert capacity_of(nodes) == Resources.parse({"cpu": "8", "memory": "32Gi", "pods": "220"})


def test_row_from_queue_status() -> None:
    row = queue_row(_queue("ml", allocated={"cpu": "18", "memory": "18Gi"},
                           deserved={"cpu": "24", "memory": "24Gi"}, dominantShare=0.5625,
                           admitted=9, pending=4), CAPACITY)
    assert (row.name, row.weight, row.state) == ("ml", 3, "Open")
    assert row.share == 0.5625
    assert row.deserved_share == 0.75  # 24 of 32 CPU
    assert row.bar_counts == (9, 13)
    assert row.guarantee == Resources.parse({"cpu": "8"})


def test_row_without_status_or_capacity() -> None:
    row = queue_row({"metadata": {"name": "new"}}, None)
    assert (row.weight, row.share, row.deserved_share, row.admitted, row.pending) == (
        1, 0.0, None, 0, 0)
    assert row.allocated == Resources()


def test_malformed_quantities_do_not_break_the_table() -> None:
    row = queue_row(_queue("odd", allocated={"cpu": "lots"}, dominantShare="x"), CAPACITY)
    assert row.allocated == Resources() and row.share == 0.0


def test_dominant_share_ignores_resources_without_capacity() -> None:
    amounts = Resources.parse({"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": "1"})
    assert dominant_share(amounts, CAPACITY) == 0.5
    assert dominant_share(amounts, Resources()) == 0.0


def test_format_resources_orders_and_shortens() -> None:
    amounts = Resources.parse({"memory": "24Gi", "example.com/fpga": "2", "cpu": "1500m",
                               "nvidia.com/gpu": "1"})
    assert format_resources(amounts) == "cpu 1500m, mem 24Gi, gpu 1, example.com/fpga 2"
    assert format_resources(Resources()) == "-"


def test_share_bar_fills_and_marks_the_deserved_share() -> None:
    assert share_bar(0.5, 0.75, UNICODE, width=8) == "████  │ "
    assert share_bar(1.0, None, UNICODE, width=8) == "████████"
    assert share_bar(0.0, 0.0, UNICODE, width=8) == "│       "
    # Above its deserved share the marker shows inside the bar.
    assert share_bar(1.0, 0.5, UNICODE, width=8) == "████│███"
    assert share_bar(0.5625, None, UNICODE, width=8) == "████▌   "
    assert share_bar(0.5625, 0.5625, ASCII, width=8) == "####|   "
    assert share_bar(1.7, 2.0, UNICODE, width=4) == "███│"  # clamped


def test_progress_bar_and_sparkline() -> None:
    assert progress_bar(3, 12, UNICODE, width=4) == "█░░░"
    assert progress_bar(0, 0, ASCII, width=4) == "...."
    assert progress_bar(12, 12, ASCII, width=4) == "####"
    assert sparkline([0.0, 0.5, 1.0], UNICODE) == "▁▅█"
    assert sparkline([0.1] * 40, ASCII, width=5) == "_____"


def test_glyphs_follow_the_stream_encoding() -> None:
    utf8 = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    latin = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    assert glyphs_for(utf8) is UNICODE
    assert glyphs_for(latin) is ASCII


def test_table_is_aligned_sorted_and_complete() -> None:
    rows = [
        queue_row(_queue("ml-training", allocated={"cpu": "18", "memory": "18Gi"},
                         deserved={"cpu": "18", "memory": "18Gi"}, dominantShare=0.5625,
                         admitted=9, pending=8), CAPACITY),
        QueueRow(name="ci", weight=1, state="Closed", guarantee=Resources(),
                 allocated=Resources(), deserved=Resources(), share=0.0,
                 deserved_share=None, admitted=0, pending=0),
    ]
    text = render_table(rows, ASCII)
    lines = text.splitlines()
    assert lines[0].split() == ["QUEUE", "WEIGHT", "GUARANTEE", "ALLOCATED", "DESERVED",
                                "SHARE", "(#", "now", "|", "deserved)", "NOW", "/",
                                "DESERVED", "ADMITTED", "PENDING"]
    assert [line.split()[0] for line in lines[1:]] == ["ci", "ml-training"]
    assert lines[1].startswith("ci (Closed)")
    ml = lines[2]
    assert "cpu 8" in ml and "cpu 18, mem 18Gi" in ml
    assert "0.56 / 0.56" in ml
    assert "9/17" in ml and ml.rstrip().endswith("8")
    assert "0.00 /   -  " in lines[1]
    # Columns line up: every cell starts where its header starts.
    for header in ("GUARANTEE", "ALLOCATED", "ADMITTED"):
        column = lines[0].index(header)
        assert all(line[column - 2:column] == "  " for line in lines[1:])
    assert text.endswith("\n")


def test_table_with_history_adds_a_sparkline_column() -> None:
    row = QueueRow(name="a", weight=1, state="Open", guarantee=Resources(),
                   allocated=Resources(), deserved=Resources(), share=0.5,
                   deserved_share=0.5, admitted=1, pending=1, progress=(1, 4),
                   history=(0.0, 0.5, 1.0))
    text = render_table([row], UNICODE)
    assert "SHARE OVER TIME" in text.splitlines()[0]
    assert "▁▅█" in text and "1/4" in text


def test_no_queues() -> None:
    assert render_table([], UNICODE) == "No queues.\n"


def test_reserved_units_are_listed_with_their_checks() -> None:
    units: list[dict[str, Any]] = [
        {"metadata": {"namespace": "team", "name": "job-big"}, "spec": {"queue": "a"},
         "status": {"phase": "Reserved", "admissionChecks": [
             {"name": "boss", "state": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z"},
             {"name": "capacity", "state": "Ready"}]}},
        {"metadata": {"namespace": "team", "name": "job-done"}, "spec": {"queue": "a"},
         "status": {"phase": "Dequeued"}},
    ]
    text = render_reserved(units, now=1767225600.0 + 90)
    assert "Waiting on admission checks" in text
    assert "team/job-big  queue a  boss=Pending 90s  capacity=Ready" in text
    assert "job-done" not in text
    assert render_reserved(units[1:], now=0.0) == ""


def test_table_shows_the_tree_of_queues() -> None:
    """DESIGN §11: each queue under its parent, indented; an unknown parent or
    a cycle shows at the top rather than hiding the queue."""
    def row(name: str, parent: str = "") -> Any:
        obj = _queue(name)
        obj["spec"]["parent"] = parent
        return queue_row(obj, CAPACITY)

    rows = [row("zeta"), row("org"), row("web", "product"), row("product", "org"),
            row("ai", "org"), row("stray", "ghost"), row("c1", "c2"), row("c2", "c1")]
    lines = render_table(rows, ASCII).splitlines()[1:]
    assert [line[: len(line) - len(line.lstrip())] + line.split()[0] for line in lines] == [
        "org", "  ai", "  product", "    web", "stray", "zeta", "c1", "  c2"]


def test_unqueued_usage_gets_a_column_only_when_some_queue_has_any() -> None:
    """Issue #25: pods no admitted unit covers, from Queue status.unqueued."""
    quiet = queue_row(_queue("a", allocated={"cpu": "2"}), CAPACITY)
    assert "UNQUEUED" not in render_table([quiet])
    charged = queue_row(_queue("b", allocated={"cpu": "3"}, unqueued={"cpu": "2"},
                               unqueuedPods=2), CAPACITY)
    assert charged.unqueued == Resources.parse({"cpu": "2"}) and charged.unqueued_pods == 2
    lines = render_table([quiet, charged]).splitlines()
    assert lines[0].rstrip().endswith("UNQUEUED")
    assert lines[1].rstrip().endswith("-") and lines[2].rstrip().endswith("2 pods: cpu 2")
