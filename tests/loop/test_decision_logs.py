"""Item 17: one structured log line per decision (admit, backoff, requeue,
evict), with the fields docs/configuration.md promises (`queue`, `unit`), rendered by
the server's JSON formatter as one object per line."""

from __future__ import annotations

import json
import logging
import random

import pytest

from arbiter.cli.serve import JsonFormatter
from arbiter.loop.settings import LoopSettings
from tests.loop.harness import Cluster


def decisions(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if hasattr(r, "decision")]


async def test_an_admission_logs_exactly_one_json_line_with_queue_and_unit(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    c = Cluster()
    await c.nodes(1, cpu="2")  # one node that holds the 2-CPU pod (node fit)
    await c.queue("q")
    await c.job("ns", "train", "q", cpu="2")
    await c.settle()
    assert not c.suspended("ns", "train")
    lines = decisions(caplog)
    assert len(lines) == 1
    entry = json.loads(JsonFormatter().format(lines[0]))
    assert entry["level"] == "info"
    assert entry["decision"] == "admit"
    assert entry["queue"] == "q"
    assert entry["unit"] == "ns/job-train"
    assert entry["resources"] == {"cpu": "2"}
    assert entry["reason"]
    assert entry["attempt"] == 1


async def test_a_backoff_and_its_requeue_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    c = Cluster(LoopSettings(debounce=0.0, admission_timeout=60.0, backoff_base=10.0))
    c.controller.rng = random.Random(0)
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "stuck", "q")
    await c.settle()
    c.clock.advance(61)
    await c.settle()
    c.clock.advance(16)
    await c.settle()
    kinds = [(r.decision, r.unit) for r in decisions(caplog)]  # type: ignore[attr-defined]
    assert kinds == [("admit", "ns/job-stuck"), ("backoff", "ns/job-stuck"),
                     ("requeue", "ns/job-stuck"), ("admit", "ns/job-stuck")]
    backoff = decisions(caplog)[1]
    assert backoff.levelno == logging.WARNING and "not running" in backoff.reason  # type: ignore[attr-defined]


async def test_each_eviction_is_one_decision_line(caplog: pytest.LogCaptureFixture) -> None:
    from tests.reclaim.test_loop import GRACE, ReclaimCluster, pods_fill_then_arrive, tenants

    caplog.set_level(logging.INFO)
    c = ReclaimCluster()
    await tenants(c)
    await pods_fill_then_arrive(c)
    await c.look(GRACE + 1)
    evictions = [r for r in decisions(caplog) if r.decision == "evict"]  # type: ignore[attr-defined]
    assert len(evictions) == len(c.evicting.evicted) == 5
    entry = json.loads(JsonFormatter().format(evictions[0]))
    assert entry["queue"] == "a" and entry["unit"].startswith("na/pod-")
    assert entry["for_queue"] == "b" and entry["cause"] == "reclaim"
    assert entry["reason"].startswith("reclaimed by queue b") and entry["resources"]
