"""Sandbox health with arbiter replicas started and stopped by tests.

The processes are stand-in sleepers recorded in a Sandbox's state.json (no
control plane): what is checked is which records count for `healthy()`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter.sandbox import Sandbox, cli, process
from arbiter.sandbox.cluster import ARBITER_PRIMARY, STATE_VERSION

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    monkeypatch.setattr(Sandbox, "ready_nodes", lambda self: 1)
    sb = Sandbox(tmp_path, quiet=True)
    sb._state = {"version": STATE_VERSION, "nodes": {"count": 1}, "processes": {}}
    sb._save_state()
    try:
        for name in ("etcd", ARBITER_PRIMARY):
            sb._spawn(name, SLEEPER, ports={}, health_url=None)
        yield sb
    finally:
        sb._stop_all()


def _start(sb: Sandbox, name: str) -> process.ProcessRecord:
    return sb._spawn(name, SLEEPER, ports={"https": 1}, health_url=None)


def _crash(record: process.ProcessRecord) -> None:
    os.killpg(record.pid, signal.SIGKILL)
    assert process.wait_exit(record, 5.0)


def _cli_status(directory: Path,
                capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = cli._status(argparse.Namespace(dir=directory, json=True))
    return code, json.loads(capsys.readouterr().out)


def test_replica_stopped_on_purpose_does_not_make_the_sandbox_unhealthy(
        sandbox: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    _start(sandbox, "arbiter-2")
    assert sandbox.healthy()
    assert sandbox.stop_arbiter("arbiter-2") == -signal.SIGTERM
    assert sandbox.healthy()
    replica = {c.name: c for c in sandbox.status()}["arbiter-2"]
    assert not replica.running and not replica.required
    assert replica.detail.startswith("stopped on purpose")
    # Another process reading state.json (the CLI, a reused e2e sandbox) agrees.
    assert Sandbox(sandbox.dir).healthy()
    code, document = _cli_status(sandbox.dir, capsys)
    assert code == 0 and document["healthy"] is True
    # Restarted, it counts again; killed on purpose, it stops counting again.
    _start(sandbox, "arbiter-2")
    assert {c.name: c for c in sandbox.status()}["arbiter-2"].required
    assert sandbox.kill_arbiter("arbiter-2") == -signal.SIGKILL
    assert sandbox.healthy()


def test_crashed_replica_still_counts(sandbox: Sandbox) -> None:
    replica = _start(sandbox, "arbiter-2")
    _crash(replica)
    assert not sandbox.healthy()


def test_crashed_primary_still_counts(
        sandbox: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    _crash(sandbox.processes()[ARBITER_PRIMARY])
    assert not sandbox.healthy()
    code, document = _cli_status(sandbox.dir, capsys)
    assert code == 1 and document["healthy"] is False


def test_primary_stopped_on_purpose_still_counts(sandbox: Sandbox) -> None:
    # The webhooks and the scheduler's extender point at the primary.
    sandbox.kill_arbiter()
    assert not sandbox.healthy()
    assert {c.name: c for c in sandbox.status()}[ARBITER_PRIMARY].required
    _start(sandbox, ARBITER_PRIMARY)
    assert sandbox.healthy()
