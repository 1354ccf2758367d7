"""Reclaim and within-queue preemption on the real control plane (10 fake
nodes × 1 CPU).

The module restarts the primary arbiter with a short `--reclaim-grace` and
restores the default afterwards; reclaim with the DEFAULT grace (30 s) is
tested in tests/e2e/test_reclaim_fair.py. Every test uses its own queues and
namespaces (random suffix) on a quiet cluster and removes them afterwards
(`scenario` from tests/e2e/helpers.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    CPUS,
    admissions,
    arbiter_with,
    create,
    get,
    job,
    job_complete,
    metrics,
    pod,
    priority_class,
    released,
    scenario,
    suffix,
    units,
    wait_for,
)

GRACE = 5.0
# Grace, a look every second, the evictions, the watch and kube-scheduler:
# well under the three minutes the issue allows.
CONVERGE_WITHIN = 90.0


@pytest.fixture(scope="module", autouse=True)
def short_grace(sandbox: Sandbox) -> Iterator[None]:
    """The primary arbiter with --reclaim-grace 5 for this module only."""
    with arbiter_with(sandbox, ["--reclaim-grace", str(GRACE)]):
        yield


def preempted(sandbox: Sandbox, queue_name: str, reason: str = "reclaim") -> float:
    return metrics(sandbox).get(
        ("arbiter_preempted_units_total", (("queue", queue_name), ("reason", reason))), 0.0)


def running(sandbox: Sandbox, ns: str) -> list[str]:
    """Pods that run and are not on their way out."""
    return sorted(p["metadata"]["name"] for p in get(sandbox, "pods", "-n", ns)["items"]
                  if (p.get("status") or {}).get("phase") == "Running"
                  and not p["metadata"].get("deletionTimestamp"))


def events(sandbox: Sandbox, ns: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in get(sandbox, "events", "-n", ns)["items"] if e["reason"] == reason]


def unsuspended(sandbox: Sandbox, ns: str) -> list[str]:
    return sorted(j["metadata"]["name"] for j in get(sandbox, "jobs", "-n", ns)["items"]
                  if not j["spec"].get("suspend"))


def complete(sandbox: Sandbox, ns: str) -> list[str]:
    return sorted(j["metadata"]["name"] for j in get(sandbox, "jobs", "-n", ns)["items"]
                  if job_complete(j))


def prioritised(name: str, ns: str, klass: str) -> dict[str, Any]:
    body = pod(name, ns)
    body["spec"]["priorityClassName"] = klass
    return body


# -- across queues -------------------------------------------------------------------


def test_plain_pods_converge_to_five_and_five(sandbox: Sandbox) -> None:
    tag = suffix()
    qa, qb = f"ra-{tag}", f"rb-{tag}"
    with scenario(sandbox, {qa: {"namespaces": [qa]}, qb: {"namespaces": [qb]}}, [qa, qb]):
        create(sandbox, *(pod(f"p{i:02d}", qa) for i in range(CPUS)))
        wait_for("A runs 10 pods", lambda: len(running(sandbox, qa)) == CPUS)
        before = preempted(sandbox, qa)
        started = time.monotonic()
        create(sandbox, *(pod(f"p{i:02d}", qb) for i in range(CPUS)))
        wait_for("A and B at 5 and 5", lambda: (len(running(sandbox, qa)),
                                                len(running(sandbox, qb))) == (5, 5),
                 timeout=CONVERGE_WITHIN)
        took = time.monotonic() - started
        assert took >= GRACE  # not before the grace period
        # Stable: nothing more is taken, B's other five keep waiting gated.
        time.sleep(GRACE + 3)
        assert (len(running(sandbox, qa)), len(running(sandbox, qb))) == (5, 5)
        assert len(get(sandbox, "pods", "-n", qa)["items"]) == 5  # 5 evicted (deleted)
        assert len(released(sandbox, qb)) == 5
        assert preempted(sandbox, qa) - before == 5
        reclaimed = events(sandbox, qa, "ReclaimedByQueue")
        assert {e["involvedObject"]["kind"] for e in reclaimed} >= {"Pod"}
        assert all(f"reclaimed by queue {qb}" in e["message"] for e in reclaimed)
        assert events(sandbox, qb, "Reclaiming")
        print(f"plain pods: converged to 5/5 in {took:.1f}s (grace {GRACE:.0f}s)")


def test_jobs_are_requeued_not_lost_and_all_complete(sandbox: Sandbox) -> None:
    tag = suffix()
    qa, qb = f"ja-{tag}", f"jb-{tag}"
    with scenario(sandbox, {qa: {"namespaces": [qa]}, qb: {"namespaces": [qb]}}, [qa, qb]):
        create(sandbox, *(job(f"a{i:02d}", qa, runs_for="25s") for i in range(CPUS)))
        wait_for("A runs 10 Jobs", lambda: len(running(sandbox, qa)) == CPUS)
        started = time.monotonic()
        create(sandbox, *(job(f"b{i:02d}", qb, runs_for="5s") for i in range(CPUS)))
        wait_for("B admitted 5 Jobs, A kept 5", lambda: (
            len(unsuspended(sandbox, qa)), len(unsuspended(sandbox, qb))) == (5, 5),
            timeout=CONVERGE_WITHIN)
        took = time.monotonic() - started
        requeued = {j["metadata"]["name"] for j in get(sandbox, "jobs", "-n", qa)["items"]
                    if j["spec"].get("suspend")}
        assert len(requeued) == 5
        by_unit = {u["metadata"]["name"]: u for u in units(sandbox, qa)}
        for name in requeued:
            status = by_unit[f"job-{name}"]["status"]
            assert status["phase"] == "Enqueued"
            # The message says why the unit waits now: first who reclaimed it;
            # the head of A's queue may already say why it waits (its queue's
            # reason: the cluster full, or which node it waits for, DESIGN
            # §10, while the evicted pods still hold their nodes).
            # Who reclaimed each Job is checked through its events below.
            message = status["message"]
            assert (f"reclaimed by queue {qb}" in message
                    or message.startswith(f"waiting in queue {qa}: ")), message
        wait_for("all 20 Jobs complete", lambda: len(complete(sandbox, qa))
                 + len(complete(sandbox, qb)) == 2 * CPUS, timeout=180, poll=1.0)
        counts = {u["metadata"]["name"]: len(admissions(u)) for u in units(sandbox, qa)}
        assert sorted(counts.values()) == [1] * 5 + [2] * 5  # none lost, none twice at once
        assert {n for n, c in counts.items() if c == 2} == {f"job-{n}" for n in requeued}
        assert all(len(admissions(u)) == 1 for u in units(sandbox, qb))
        assert all(u["status"]["phase"] == "Succeed" for u in units(sandbox, qa))
        job_events = [e for e in events(sandbox, qa, "ReclaimedByQueue")
                      if e["involvedObject"]["kind"] == "Job"]
        assert {e["involvedObject"]["name"] for e in job_events} == requeued
        print(f"Jobs: B got its 5 after {took:.1f}s (grace {GRACE:.0f}s)")


def test_a_non_reclaimable_queue_is_never_reclaimed_from(sandbox: Sandbox) -> None:
    tag = suffix()
    qa, qb = f"na-{tag}", f"nb-{tag}"
    with scenario(sandbox, {qa: {"namespaces": [qa], "reclaimable": False},
                            qb: {"namespaces": [qb]}}, [qa, qb]):
        create(sandbox, *(pod(f"p{i:02d}", qa) for i in range(CPUS)))
        wait_for("A runs 10 pods", lambda: len(running(sandbox, qa)) == CPUS)
        before = preempted(sandbox, qa)
        create(sandbox, *(pod(f"p{i:02d}", qb) for i in range(CPUS)))
        wait_for("B's 10 units", lambda: len(units(sandbox, qb)) == CPUS)
        time.sleep(3 * GRACE)
        assert len(running(sandbox, qa)) == CPUS
        assert released(sandbox, qb) == []
        assert preempted(sandbox, qa) == before
        assert events(sandbox, qa, "ReclaimedByQueue") == []


# -- inside a queue ----------------------------------------------------------------------


def within_queue(sandbox: Sandbox, policy: str | None) -> tuple[list[str], str, str]:
    """Queue at its capability (3) with three low-priority pods; then a
    high-priority pod and an equal-priority one. Returns the low pods still
    running after a while, whether "high" and "same" were released."""
    tag = suffix()
    qw, high = f"w-{tag}", f"rc-high-{tag}"
    spec: dict[str, Any] = {"namespaces": [qw], "capability": {"cpu": "3"}}
    if policy is not None:
        spec["preemption"] = {"withinQueue": policy}
    create(sandbox, priority_class(high, 1000))
    try:
        with scenario(sandbox, {qw: spec}, [qw]):
            create(sandbox, *(pod(f"low{i}", qw) for i in range(3)))
            wait_for("3 low pods run", lambda: len(running(sandbox, qw)) == 3)
            before = preempted(sandbox, qw, "withinQueue")
            create(sandbox, prioritised("high", qw, high))
            create(sandbox, pod("same", qw))
            if policy == "LowerPriority":
                wait_for("high runs", lambda: "high" in running(sandbox, qw), timeout=60)
            time.sleep(GRACE + 3)
            now_running = running(sandbox, qw)
            assert len(now_running) == 3  # never above the capability
            gone = preempted(sandbox, qw, "withinQueue") - before
            assert gone == (1 if policy == "LowerPriority" else 0)
            if policy == "LowerPriority":
                said = events(sandbox, qw, "PreemptedByArbiter")
                assert said and all("higher-priority unit" in e["message"] for e in said)
            is_released = set(released(sandbox, qw))
            return (now_running, "high" if "high" in is_released else "",
                    "same" if "same" in is_released else "")
    finally:
        sandbox.kubectl("delete", "priorityclass", high, "--ignore-not-found", check=False)


def test_within_queue_lower_priority_displaces_a_low_priority_pod(sandbox: Sandbox) -> None:
    now_running, high, same = within_queue(sandbox, "LowerPriority")
    assert high == "high" and same == ""
    assert sum(1 for name in now_running if name.startswith("low")) == 2


def test_within_queue_never_does_not(sandbox: Sandbox) -> None:
    now_running, high, same = within_queue(sandbox, None)
    assert (high, same) == ("", "")
    assert now_running == ["low0", "low1", "low2"]

