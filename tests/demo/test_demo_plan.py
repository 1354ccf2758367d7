"""`arbiter demo` without a cluster: the plan, Job counting, drawing."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from arbiter.cli.demo import (
    TENANTS,
    Observation,
    Screen,
    Tracker,
    count_jobs,
    explore_help,
    job_object,
    plan_tenants,
    queue_object,
    summary,
)
from arbiter.core.resources import Resources

NODE = Resources.parse({"cpu": "4", "memory": "16Gi"})
CLUSTER = Resources.parse({"cpu": "32", "memory": "128Gi"})


def test_plan_for_eight_four_cpu_nodes() -> None:
    plans = {p.tenant.name: p for p in plan_tenants(CLUSTER, NODE, 90.0, 1.0)}
    ml, analytics, ci = plans["ml-training"], plans["analytics"], plans["ci"]
    assert ml.requests == Resources.parse({"cpu": "2", "memory": "2Gi"})
    assert analytics.requests == Resources.parse({"cpu": "1", "memory": "8Gi"})
    # ml-training's first burst asks for 1.5 times the cluster's CPU.
    assert ml.waves[0] == (0.0, 24)
    assert ml.waves[0][1] * 2 == 48
    # analytics' dominant resource is memory: 16 Jobs of 8Gi fill 128Gi.
    assert analytics.waves[0][1] == 16
    assert ci.guarantee == Resources.parse({"cpu": "8", "memory": "32Gi"})
    assert not ml.guarantee and not analytics.guarantee
    # Arrivals in order, all inside the submit window (55 % of the run).
    assert ml.waves[0][0] < analytics.waves[0][0] < ci.waves[0][0]
    assert all(at < 90 * 0.55 for p in plans.values() for at, _ in p.waves)
    assert [p.run_seconds for p in plans.values()] == [15, 12, 6]


def test_plan_scales_with_duration_load_and_node_size() -> None:
    small = Resources.parse({"cpu": "1", "memory": "8Gi"})
    cluster = Resources.parse({"cpu": "10", "memory": "80Gi"})
    plans = plan_tenants(cluster, small, 30.0, 0.3)
    ml = plans[0]
    assert ml.requests == Resources.parse({"cpu": "500m", "memory": "1Gi"})
    assert ml.run_seconds == 5
    assert ml.waves[0][1] == 9  # ceil(1.5 × 0.3 / 0.05)
    assert all(p.total >= len(p.waves) for p in plans)
    assert sum(p.total for p in plans) < sum(p.total for p in plan_tenants(
        cluster, small, 30.0, 1.0))


def test_objects() -> None:
    plan = plan_tenants(CLUSTER, NODE, 90.0, 1.0)[2]
    queue = queue_object(plan)
    assert queue["spec"] == {"weight": 1, "namespaces": ["ci"],
                             "guarantee": {"cpu": "8", "memory": "32Gi"}}
    assert queue["metadata"]["labels"] == {"app.kubernetes.io/part-of": "arbiter-demo"}
    job = job_object(plan, "run1")
    template = job["spec"]["template"]
    assert job["metadata"]["generateName"] == "ci-"
    assert job["metadata"]["labels"]["demo.arbiter.dev/run"] == "run1"
    assert template["metadata"]["annotations"] == {
        "pod-complete.stage.kwok.x-k8s.io/delay": "6s"}
    assert template["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "1", "memory": "1Gi"}


def _job(suspend: bool, start: str | None = None, succeeded: int = 0) -> dict[str, Any]:
    status: dict[str, Any] = {"succeeded": succeeded}
    if start:
        status["startTime"] = start
    return {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"suspend": suspend, "completions": 1}, "status": status}


def test_count_jobs() -> None:
    counts = count_jobs([_job(True), _job(False), _job(False, "2026-01-01T00:00:04Z"),
                         _job(False, "2026-01-01T00:00:10Z", succeeded=1)])
    assert (counts.created, counts.admitted, counts.completed) == (4, 3, 1)
    assert sorted(counts.waits) == [4.0, 10.0]


def test_summary_reports_each_tenant() -> None:
    plans = plan_tenants(CLUSTER, NODE, 90.0, 1.0)
    tracker = Tracker(plans, CLUSTER, "run")
    tracker.contended["ml-training"] = [(0.5, 0.56), (0.6, 0.56)]
    observation = Observation([], {"ml-training": count_jobs([
        _job(False, "2026-01-01T00:00:04Z", succeeded=1), _job(True)])})
    text = summary(observation, tracker, plans, 61.2, ["ci: boom"])
    lines = text.splitlines()
    assert lines[0] == "Summary after 61s:"
    ml = next(line for line in lines if line.startswith("  ml-training"))
    assert ml.split() == ["ml-training", "3", "2", "1", "1", "4s", "4s", "0.55", "0.56"]
    assert next(line for line in lines if line.startswith("  ci")).split()[2:5] == [
        "0", "0", "0"]
    assert "1 Job(s) could not be created, e.g. ci: boom" in text


def test_explore_help(tmp_path: Path) -> None:
    text = explore_help(tmp_path / "kubeconfig", tmp_path)
    assert f"{tmp_path}/bin/kubectl get queues" in text
    assert f"sandbox down --dir {tmp_path}" in text
    assert "queues --kubeconfig" in text
    other = explore_help(tmp_path / "kubeconfig", None)
    assert "kubectl delete queue " + " ".join(t.name for t in TENANTS) in other


def test_screen_prints_snapshots_without_a_terminal() -> None:
    out = io.StringIO()
    with Screen(out, live=False, snapshot_every=3600) as screen:
        screen.show("first")
        screen.show("second")  # too soon: skipped
        screen.show("last", force=True)
    assert out.getvalue() == "first\nlast\n"


def test_screen_redraws_in_place_on_a_terminal() -> None:
    out = io.StringIO()
    with Screen(out, live=True, snapshot_every=10) as screen:
        screen.show("a\nb")
    text = out.getvalue()
    assert text.startswith("\x1b[?25l") and text.endswith("\x1b[?25h")
    assert "\x1b[Ha\x1b[K\nb\x1b[K\n\x1b[J" in text
