"""The controller against an in-memory apiserver and a real ClusterStore."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from arbiter.base.metrics import REGISTRY
from arbiter.cache.store import ClusterStore
from arbiter.core.api import QUEUE_LABEL
from arbiter.jobflow.controller import JobFlowController
from tests.jobflow.fakes import NAMESPACE, FakeCluster, flow, template

KEY = f"{NAMESPACE}/demo"
DIAMOND: list[dict[str, Any]] = [
    {"name": "a"},
    {"name": "b", "dependsOn": {"targets": ["a"]}},
    {"name": "c", "dependsOn": {"targets": ["b"]}},
    {"name": "d", "dependsOn": {"targets": ["b"]}},
    {"name": "e", "dependsOn": {"targets": ["c", "d"]}},
]


@pytest.fixture
def cluster() -> FakeCluster:
    store = ClusterStore()
    fake = FakeCluster(store)
    for name in ("a", "b", "c", "d", "e", "cleanup"):
        fake.add_template(template(name))
    return fake


def controller(cluster: FakeCluster) -> JobFlowController:
    return JobFlowController(cluster.store, cluster, clock=cluster.clock)


async def settle(ctl: JobFlowController, cluster: FakeCluster) -> None:
    cluster.sync()
    await ctl.reconcile(KEY)
    cluster.sync()


async def test_diamond_runs_in_dependency_order_and_succeeds(cluster: FakeCluster) -> None:
    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    succeeded_before = sample("arbiter_jobflow_phase_total", {"phase": "Succeed"})
    durations_before = sample("arbiter_jobflow_step_duration_seconds_count")
    seconds_before = sample("arbiter_jobflow_step_duration_seconds_sum")
    cluster.add_flow(flow("demo", DIAMOND))
    ctl = controller(cluster)
    await settle(ctl, cluster)
    assert cluster.created == ["demo-a"]
    assert cluster.status_of("demo")["state"]["phase"] == "Running"
    assert cluster.step("demo", "b")["phase"] == "Waiting"
    assert cluster.step("demo", "b")["message"] == "waiting for a"
    job = cluster.job("demo-a")
    assert job["metadata"]["labels"][QUEUE_LABEL] == "team"  # the namespace's queue
    assert job["metadata"]["ownerReferences"][0]["uid"] == "flow-uid"

    cluster.start("demo-a")
    await settle(ctl, cluster)
    assert cluster.step("demo", "a")["phase"] == "Running"
    assert cluster.created == ["demo-a"]

    cluster.finish("demo-a")
    await settle(ctl, cluster)
    assert cluster.created == ["demo-a", "demo-b"]
    cluster.finish("demo-b")
    await settle(ctl, cluster)
    assert cluster.created == ["demo-a", "demo-b", "demo-c", "demo-d"]
    cluster.finish("demo-c")
    await settle(ctl, cluster)
    assert "demo-e" not in cluster.created  # d still runs
    assert cluster.step("demo", "e")["message"] == "waiting for d"
    cluster.finish("demo-d")
    await settle(ctl, cluster)
    assert cluster.created[-1] == "demo-e"
    cluster.finish("demo-e")
    await settle(ctl, cluster)

    status = cluster.status_of("demo")
    assert status["state"] == {"phase": "Succeed"}
    assert status["progress"] == "5/5"
    assert status["completedJobs"] == ["demo-a", "demo-b", "demo-c", "demo-d", "demo-e"]
    assert status["pendingJobs"] == status["runningJobs"] == status["failedJobs"] == []
    a = cluster.step("demo", "a")
    assert a["phase"] == "Succeed"
    assert a["restartCount"] == 0
    assert a["runningDuration"] == "10s"
    assert a["createTime"] <= a["startTime"] < a["finishTime"]
    assert [h["phase"] for h in a["history"]] == ["Succeed"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Running": "False", "Succeeded": "True"}
    assert sample("arbiter_jobflow_phase_total", {"phase": "Succeed"}) == succeeded_before + 1
    assert sample("arbiter_jobflow_step_duration_seconds_count") == durations_before + 5
    # Each step ran 10 s (start to finish of its Job).
    assert sample("arbiter_jobflow_step_duration_seconds_sum") == seconds_before + 50


async def test_never_two_jobs_for_one_attempt(cluster: FakeCluster) -> None:
    cluster.add_flow(flow("demo", DIAMOND))
    ctl = controller(cluster)
    await ctl.reconcile(KEY)
    # The cache has not seen demo-a yet: the controller must remember it,
    # neither creating it again nor taking it for deleted.
    await ctl.reconcile(KEY)
    assert cluster.created == ["demo-a"]
    assert cluster.step("demo", "a")["phase"] == "Pending"
    assert cluster.status_of("demo")["state"] == {"phase": "Running"}
    # A restarted controller (no memory, cache still behind) adopts it.
    cluster.store.listeners.clear()
    fresh = controller(cluster)
    await fresh.reconcile(KEY)
    assert cluster.created == ["demo-a"]
    assert len(cluster.jobs) == 1
    assert cluster.step("demo", "a")["history"][0]["phase"] == "Pending"
    cluster.sync()
    await fresh.reconcile(KEY)
    assert cluster.created == ["demo-a"]
    assert cluster.step("demo", "a")["phase"] == "Pending"


async def test_status_is_written_only_when_it_changes(cluster: FakeCluster) -> None:
    cluster.add_flow(flow("demo", DIAMOND))
    ctl = controller(cluster)
    await settle(ctl, cluster)
    writes = cluster.status_writes
    assert writes == 1
    cluster.now += 100
    for _ in range(3):
        await settle(ctl, cluster)
    assert cluster.status_writes == writes
    cluster.start("demo-a")
    await settle(ctl, cluster)
    assert cluster.status_writes == writes + 1


async def test_failed_step_retries_then_fails_the_flow(cluster: FakeCluster) -> None:
    steps: list[dict[str, Any]] = [
        {"name": "a"},
        {"name": "b", "dependsOn": {"targets": ["a"]}, "maxRetries": 1},
        {"name": "e", "dependsOn": {"targets": ["b"]}},
        {"name": "cleanup", "dependsOn": {"targets": ["b"], "condition": "Failed"}},
    ]
    cluster.add_flow(flow("demo", steps))
    ctl = controller(cluster)
    await settle(ctl, cluster)
    cluster.finish("demo-a")
    await settle(ctl, cluster)
    cluster.finish("demo-b", ok=False)
    await settle(ctl, cluster)
    assert cluster.created == ["demo-a", "demo-b", "demo-b-r1"]
    assert cluster.status_of("demo")["state"]["phase"] == "Running"
    cluster.finish("demo-b-r1", ok=False)
    await settle(ctl, cluster)
    assert cluster.created == ["demo-a", "demo-b", "demo-b-r1", "demo-cleanup"]
    status = cluster.status_of("demo")
    assert status["state"] == {"phase": "Failed", "message": "step b failed after 2 attempts"}
    assert status["failedJobs"] == ["demo-b", "demo-b-r1"]
    b = cluster.step("demo", "b")
    assert b["restartCount"] == 1
    assert b["jobName"] == "demo-b-r1"
    assert [h["jobName"] for h in b["history"]] == ["demo-b", "demo-b-r1"]
    assert cluster.step("demo", "e")["phase"] == "Skipped"
    # The cleanup step still runs to its end; e never gets a Job.
    cluster.finish("demo-cleanup")
    await settle(ctl, cluster)
    assert "demo-e" not in cluster.jobs
    assert cluster.step("demo", "cleanup")["phase"] == "Succeed"
    assert cluster.status_of("demo")["state"]["phase"] == "Failed"
    assert REGISTRY.get_sample_value("arbiter_jobflow_phase_total",
                                     {"phase": "Failed"}) is not None


async def test_invalid_job_fails_the_step_without_retry(cluster: FakeCluster) -> None:
    cluster.invalid_jobs.add("demo-a")
    cluster.add_flow(flow("demo", [{"name": "a", "maxRetries": 3}]))
    ctl = controller(cluster)
    await settle(ctl, cluster)
    a = cluster.step("demo", "a")
    assert a["phase"] == "Failed"
    assert a["history"][0]["reason"] == "InvalidJob"
    assert "Required value" in a["message"]
    assert cluster.status_of("demo")["state"]["phase"] == "Failed"
    assert cluster.created == []
    await settle(ctl, cluster)  # remembered through the status: not tried again
    assert cluster.step("demo", "a")["restartCount"] == 0


async def test_missing_template_waits_then_runs(cluster: FakeCluster) -> None:
    cluster.add_flow(flow("demo", [{"name": "x", "template": "later"}]))
    ctl = controller(cluster)
    await settle(ctl, cluster)
    x = cluster.step("demo", "x")
    assert x["phase"] == "Waiting"
    assert x["message"] == 'JobTemplate "later" not found in namespace "ml"'
    assert cluster.created == []
    cluster.add_template(template("later"))
    await settle(ctl, cluster)
    assert cluster.created == ["demo-x"]


async def test_deleted_job_is_terminated_and_retried(cluster: FakeCluster) -> None:
    cluster.add_flow(flow("demo", [{"name": "a", "maxRetries": 1}]))
    ctl = controller(cluster)
    await settle(ctl, cluster)
    cluster.start("demo-a")
    await settle(ctl, cluster)
    cluster.remove("demo-a")
    await settle(ctl, cluster)
    assert cluster.created == ["demo-a", "demo-a-r1"]
    status = cluster.status_of("demo")
    assert status["terminatedJobs"] == ["demo-a"]
    assert cluster.step("demo", "a")["history"][0]["phase"] == "Terminated"


async def test_delete_policy_removes_jobs_after_success(cluster: FakeCluster) -> None:
    cluster.add_flow(flow("demo", [{"name": "a"}, {"name": "b", "dependsOn": {
        "targets": ["a"]}}], jobRetainPolicy="delete"))
    ctl = controller(cluster)
    await settle(ctl, cluster)
    cluster.finish("demo-a")
    await settle(ctl, cluster)
    assert cluster.deleted == []
    cluster.finish("demo-b")
    await settle(ctl, cluster)
    assert sorted(cluster.deleted) == ["demo-a", "demo-b"]
    await settle(ctl, cluster)
    status = cluster.status_of("demo")
    assert status["state"]["phase"] == "Succeed"  # Jobs gone, history kept
    assert status["completedJobs"] == ["demo-a", "demo-b"]
    assert status["terminatedJobs"] == []


async def test_terminating_flow_creates_nothing(cluster: FakeCluster) -> None:
    obj = flow("demo", DIAMOND)
    obj["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    cluster.add_flow(obj)
    ctl = controller(cluster)
    await settle(ctl, cluster)
    assert cluster.created == []
    assert cluster.status_of("demo")["state"]["phase"] == "Terminating"


async def test_cycle_that_slipped_past_the_webhook_fails_the_flow(cluster: FakeCluster) -> None:
    cluster.add_flow(flow("demo", [{"name": "a", "dependsOn": {"targets": ["b"]}},
                                   {"name": "b", "dependsOn": {"targets": ["a"]}}]))
    ctl = controller(cluster)
    await settle(ctl, cluster)
    assert cluster.created == []
    state = cluster.status_of("demo")["state"]
    assert state == {"phase": "Failed", "message": "spec.flows: cycle a -> b -> a"}


async def test_run_reacts_to_cache_events(cluster: FakeCluster) -> None:
    cluster.store.synced_kinds.update({"Job", "JobFlow", "JobTemplate"})
    ctl = controller(cluster)
    task = asyncio.create_task(ctl.run())
    try:
        cluster.add_flow(flow("demo", [{"name": "a"}, {"name": "b", "dependsOn": {
            "targets": ["a"]}}]))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if cluster.created:
                break
        assert cluster.created == ["demo-a"]
        cluster.finish("demo-a")
        cluster.sync()  # the Job's change alone wakes the flow
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(cluster.created) == 2:
                break
        assert cluster.created == ["demo-a", "demo-b"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_controller_runs_as_leader_only_work() -> None:
    """Started with the admission loop's leadership, not as a server task."""
    from arbiter.jobflow.controller import run_leader
    from arbiter.loop.runtime import Leadership
    from arbiter.server import app
    from arbiter.server.config import ServeConfig
    from arbiter.server.context import ServerContext

    store = ClusterStore()
    ctx = ServerContext(config=ServeConfig(), store=store, api=None)
    assert "jobflow-controller" in app.leader_tasks(ctx)
    assert not any("jobflow" in name for name in app.background_tasks(ctx, Leadership()))
    await run_leader(api=None, store=store)  # without a cluster there is nothing to do
    assert store.listeners == []
