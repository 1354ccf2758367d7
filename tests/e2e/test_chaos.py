"""A short, seeded chaos run (issue #32; `bench/chaos.py` is the full one):
its own sandbox of 200 kwok nodes, two arbiter replicas with leader
election, 20 tenants (a parent with children, a Pool), 500 Jobs of 1-4 pods
arriving over 50 s while the leader is SIGKILLed twice and kube-apiserver
restarted once. An invariant watcher with its own watches (none of
arbiter's code) judges it: no Job run twice, no unit admitted twice without
a requeue, no node over its allocatable, no queue over its capability, no
Job lost; and after the faults every Queue's status.deserved converges to
what `arbiter fairshare` computes offline for the work still there.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.chaos import Options, run

# Jobs of 1-4 pods running 1-4 s: on two shared cores the Job controller
# and the apiserver, not arbiter, set the pace of the drain.
SHORT = Options(nodes=200, node_cpu=4, node_memory_gi=16, jobs=500, arrival=50.0,
                run_seconds=(1, 4), max_pods=4, seed=32, leader_kills=2, first_kill=10.0,
                kill_gap=(40.0, 45.0), faults=("apiserver-restart",), drain_timeout=240.0,
                converge_timeout=90.0)


def test_short_chaos_run_holds_every_invariant(tmp_path: Path) -> None:
    report = run(replace(SHORT, directory=tmp_path / "sandbox"))
    print(report.table)
    violations = report.violations
    assert violations.double_run == []
    assert violations.double_admission == []
    assert violations.over_capacity == []
    assert violations.over_capability == []
    assert violations.lost == []
    assert report.failed_faults == []
    assert sorted(report.done) == sorted(report.planned) == [
        "apiserver-restart", "leader-kill", "leader-kill"]
    assert report.rejected == []
    assert report.figures.jobs == SHORT.jobs
    assert len(report.figures.takeover_lease) == 2  # both kills were followed by a new leader
    assert report.converged, report.share_mismatch
