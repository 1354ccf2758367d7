"""Admission checks (DESIGN §12) through the loop on the in-memory apiserver:
Reserved holds quota and releases nothing; Ready releases, Retry and
timeouts requeue with the quota freed, Rejected fails; a restart in the
middle loses no check state and admits nothing twice."""

from __future__ import annotations

from typing import Any

import pytest

from arbiter.base import metrics
from arbiter.base.kubeapi import job_path, unit_path
from arbiter.cli.approve import ApprovalError, answer
from arbiter.core.api import ADMISSION_CHECK, APPROVAL_CONTROLLER, format_rfc3339
from tests.loop.harness import Cluster

NS = "team"


async def admission_check(cluster: Cluster, name: str, *, controller: str = APPROVAL_CONTROLLER,
                          retry_delay: int = 60, timeout_s: int | None = None) -> None:
    spec: dict[str, Any] = {"controllerName": controller, "retryDelaySeconds": retry_delay}
    if timeout_s is not None:
        spec["timeoutSeconds"] = timeout_s
    await cluster.api.create(ADMISSION_CHECK.path, {"metadata": {"name": name}, "spec": spec})


async def gated_cluster(**check: Any) -> Cluster:
    """2 CPUs; queue `a` needs approval `boss`, queue `b` needs nothing."""
    cluster = Cluster()
    await cluster.nodes(2)
    await admission_check(cluster, "boss", **check)
    await cluster.queue("a", admissionChecks=[{"name": "boss"}])
    await cluster.queue("b")
    return cluster


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(cluster.unit_obj(NS, name).get("status") or {})


def check_states(cluster: Cluster, name: str) -> dict[str, str]:
    return {c["name"]: c["state"] for c in status(cluster, name).get("admissionChecks") or []}


async def set_check(cluster: Cluster, unit: str, check: str, state: str) -> None:
    """What another check controller would write."""
    entries = status(cluster, unit)["admissionChecks"]
    for entry in entries:
        if entry["name"] == check:
            entry["state"] = state
    await cluster.api.merge_patch(unit_path(NS, unit, status=True),
                                  {"status": {"admissionChecks": entries}})


async def test_reserved_holds_quota_releases_nothing_until_approved() -> None:
    cluster = await gated_cluster()
    await cluster.job(NS, "big", "a", parallelism=2)
    await cluster.settle()
    assert cluster.phase(NS, "job-big") == "Reserved"
    assert check_states(cluster, "job-big") == {"boss": "Pending"}
    assert cluster.suspended(NS, "big")
    assert status(cluster, "job-big")["allocated"] == {"cpu": "2"}
    assert "QuotaReserved" in cluster.events.reasons(f"{NS}/job-big")
    # Another queue's work cannot take the reserved quota.
    await cluster.job(NS, "other", "b")
    await cluster.settle()
    assert cluster.phase(NS, "job-other") in (None, "Enqueued")
    assert cluster.controller.mirror.engine.allocated("a") == {"cpu": 2000}

    assert await answer(cluster.api, NS, "job-big", "Ready", message="go") == ["boss"]
    await cluster.settle()
    assert cluster.phase(NS, "job-big") == "Dequeued"
    assert not cluster.suspended(NS, "big")
    assert status(cluster, "job-big")["lastAllocateTime"] == format_rfc3339(cluster.clock())
    assert cluster.admissions(NS, "job-big") == 1


async def test_rejected_fails_the_unit_the_job_never_starts_and_frees_quota() -> None:
    cluster = await gated_cluster()
    await cluster.job(NS, "big", "a", parallelism=2)
    await cluster.job(NS, "other", "b")
    await cluster.settle()
    assert cluster.phase(NS, "job-other") in (None, "Enqueued")
    await answer(cluster.api, NS, "job-big", "Rejected", message="too expensive")
    await cluster.settle()
    assert cluster.phase(NS, "job-big") == "Failed"
    assert cluster.suspended(NS, "big")
    final = status(cluster, "job-big")
    assert "too expensive" in final["message"]
    assert final["conditions"][0]["type"] == "AdmissionCheckRejected"
    assert "AdmissionCheckRejected" in cluster.events.reasons(f"{NS}/job-big")
    assert cluster.phase(NS, "job-other") == "Dequeued"  # the quota went to the next


async def test_retry_frees_quota_and_requeues_after_the_delay() -> None:
    cluster = await gated_cluster(controller="example.com/provisioner", retry_delay=30)
    await cluster.job(NS, "big", "a", parallelism=2)
    await cluster.settle()
    assert status(cluster, "job-big")["attempts"] == 1
    await set_check(cluster, "job-big", "boss", "Retry")
    await cluster.job(NS, "other", "b")
    await cluster.settle()
    assert cluster.phase(NS, "job-big") == "Enqueued"
    assert "requeueAt" in status(cluster, "job-big")
    assert cluster.phase(NS, "job-other") == "Dequeued"  # freed quota taken at once
    cluster.finish_job(NS, "other")
    cluster.clock.advance(29)
    await cluster.settle()
    assert cluster.phase(NS, "job-big") == "Enqueued"  # still waiting out the delay
    cluster.clock.advance(2)
    await cluster.settle()
    assert cluster.phase(NS, "job-big") == "Reserved"
    assert check_states(cluster, "job-big") == {"boss": "Pending"}
    assert status(cluster, "job-big")["attempts"] == 2


async def test_a_check_that_times_out_requeues_and_frees_the_quota() -> None:
    cluster = await gated_cluster(timeout_s=120, retry_delay=10)
    await cluster.job(NS, "big", "a", parallelism=2)
    await cluster.settle()
    cluster.clock.advance(119)
    await cluster.settle()
    assert cluster.phase(NS, "job-big") == "Reserved"
    cluster.clock.advance(1)
    await cluster.settle()
    assert cluster.phase(NS, "job-big") == "Enqueued"
    assert "timed out after 120s" in status(cluster, "job-big")["message"]
    assert cluster.controller.mirror.engine.allocated("a") == {}


async def test_restart_while_reserved_keeps_check_state_and_admits_once() -> None:
    cluster = await gated_cluster()
    await cluster.job(NS, "one", "a")
    await cluster.job(NS, "two", "a")
    await cluster.settle()
    assert cluster.phase(NS, "job-one") == cluster.phase(NS, "job-two") == "Reserved"
    await answer(cluster.api, NS, "job-one", "Ready")
    # SIGKILL: the old leader is gone without a word; a new one starts cold.
    cluster.controller.stop_listening()
    await cluster.controller.close()
    await cluster.job(NS, "three", "b")  # must not get the reserved quota
    fresh = cluster.new_controller(identity="second")
    cluster.controller = fresh
    await fresh.resync(reindex=True)
    await cluster.settle(fresh)
    assert cluster.phase(NS, "job-one") == "Dequeued" and not cluster.suspended(NS, "one")
    assert cluster.phase(NS, "job-two") == "Reserved" and cluster.suspended(NS, "two")
    assert check_states(cluster, "job-two") == {"boss": "Pending"}
    assert cluster.phase(NS, "job-three") in (None, "Enqueued")
    assert cluster.admissions(NS, "job-one") == cluster.admissions(NS, "job-two") == 1
    await answer(cluster.api, NS, "job-two", "Ready")
    await cluster.settle(fresh)
    assert cluster.phase(NS, "job-two") == "Dequeued"
    assert cluster.admissions(NS, "job-two") == 1


async def test_label_selector_picks_the_units_a_check_applies_to() -> None:
    cluster = Cluster()
    await cluster.nodes(2)
    await admission_check(cluster, "boss")
    await cluster.queue("a", admissionChecks=[
        {"name": "boss", "labelSelector": {"matchLabels": {"tier": "gold"}}}])
    await cluster.api.create(unit_path(NS), {
        "metadata": {"name": "gold", "namespace": NS, "labels": {"tier": "gold"}},
        "spec": {"queue": "a", "podSets": [{"name": "main", "count": 1,
                                            "requests": {"cpu": "1"}}]}})
    await cluster.api.create(unit_path(NS), {
        "metadata": {"name": "plain", "namespace": NS},
        "spec": {"queue": "a", "podSets": [{"name": "main", "count": 1,
                                            "requests": {"cpu": "1"}}]}})
    await cluster.settle()
    assert cluster.phase(NS, "gold") == "Reserved"
    assert cluster.phase(NS, "plain") == "Dequeued"
    gauge = metrics.admission_check_state.labels("boss", "Pending")
    assert gauge._value.get() >= 1


async def test_answer_refuses_what_waits_on_no_approval() -> None:
    cluster = await gated_cluster()
    await cluster.job(NS, "free", "b")
    await cluster.settle()
    with pytest.raises(ApprovalError, match="not waiting on admission checks"):
        await answer(cluster.api, NS, "job-free", "Ready")
    with pytest.raises(ApprovalError, match="not found"):
        await answer(cluster.api, NS, "job-nothing", "Ready")
    await cluster.job(NS, "big", "a")
    await cluster.settle()
    with pytest.raises(ApprovalError, match="does not wait on check other"):
        await answer(cluster.api, NS, "job-big", "Ready", check="other")
    assert cluster.api.objects[job_path(NS, "big")]["spec"]["suspend"] is True
