"""The admission loop on the real control plane (10 fake nodes × 1 CPU).

Every test starts from a quiet cluster (all 10 CPUs free, as /debug/queues
says), uses its own namespaces and queues (random suffix) and removes them
afterwards. To make several queues compete from the same starting line, a
test first fills the cluster with a reservation (a QueueUnit without a
consumer, in a queue of its own), creates its work, then deletes the
reservation: all capacity comes back in one event and the engine hands it out
in DRF order.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    CPUS,
    admissions,
    arbiter_get,
    create,
    debug_queues,
    get,
    hold_cluster,
    job,
    job_complete,
    lease_holder,
    let_go,
    metrics,
    pod,
    released,
    run_arbiter,
    scenario,
    suffix,
    tenant,
    units,
    wait_for,
)

# -- helpers -------------------------------------------------------------------------------


def fairshare(sandbox: Sandbox, mine: dict[str, tuple[dict[str, Any], int]]) -> dict[str, Any]:
    """What `arbiter fairshare` predicts for the cluster's state: the
    capacity arbiter sees, our queues (spec, n one-CPU units) and every
    other queue's waiting units (left by other tests, say: they count in
    `deserved`)."""
    document = debug_queues(sandbox)
    scenario: dict[str, Any] = {"capacity": document["capacity"], "queues": []}
    for name, (spec, count) in mine.items():
        scenario["queues"].append({"name": name, **_engine_fields(spec),
                                   "units": [{"count": count, "requests": {"cpu": "1"}}]})
    for name, view in document["queues"].items():
        if name in mine or not view["pending"]:
            continue
        status, body = arbiter_get(sandbox, f"/debug/queues/{name}/pending?limit=10000")
        assert status == 200
        spec = get(sandbox, "queue", name).get("spec") or {}
        scenario["queues"].append({
            "name": name, **_engine_fields(spec),
            "units": [{"requests": unit["demand"], "priority": unit["priority"]}
                      for unit in json.loads(body)["pending"]]})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(scenario, file)
    try:
        result = run_arbiter("fairshare", file.name, check=True)
    finally:
        Path(file.name).unlink()
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


def _engine_fields(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: spec[k] for k in ("weight", "guarantee", "capability", "blocking", "queuePolicy")
            if k in spec}


def nonzero(quantities: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in quantities.items() if value != "0"}


# -- scenarios ------------------------------------------------------------------------------


def test_two_queues_of_twenty_pods_share_five_and_five(sandbox: Sandbox) -> None:
    tag = suffix()
    qa, qb, qh = f"a-{tag}", f"b-{tag}", f"hold-{tag}"
    with scenario(sandbox, {qa: {"namespaces": [qa]}, qb: {"namespaces": [qb]},
                            qh: {"namespaces": [qh]}}, [qa, qb, qh]):
        hold_cluster(sandbox, qh, qh)
        create(sandbox, *(pod(f"p{i:02d}", ns) for i in range(20) for ns in (qa, qb)))
        wait_for("40 units", lambda: len(units(sandbox, qa)) + len(units(sandbox, qb)) == 40)
        let_go(sandbox, qh)
        wait_for("10 pods released", lambda: len(released(sandbox, qa))
                 + len(released(sandbox, qb)) == CPUS)
        time.sleep(2)  # nothing more is admitted
        assert len(released(sandbox, qa)) == 5 and len(released(sandbox, qb)) == 5
        prediction = fairshare(sandbox, {qa: ({}, 20), qb: ({}, 20)})["queues"][qa]
        assert prediction["admitted"] == 5
        gated = [p for p in get(sandbox, "pods", "-n", qa)["items"]
                 if p["spec"].get("schedulingGates")]
        assert len(gated) == 15

        def written() -> dict[str, Any] | None:
            status = get(sandbox, "queue", qa).get("status") or {}
            return status if status.get("admitted") == 5 and status.get("pending") == 15 \
                else None

        status = wait_for("Queue status written", written, timeout=30)
        assert status["allocated"] == {"cpu": "5"} == nonzero(prediction["allocated"])
        assert status["deserved"] == nonzero(prediction["deserved"])
        assert status["dominantShare"] == 0.5 == prediction["dominantShare"]
        assert [u["position"] for u in status["pendingUnits"]] == list(range(1, 11))
        # kubectl's printer columns show the one-line summaries, not map[...].
        assert status["allocatedSummary"] == "cpu=5"
        table = sandbox.kubectl("get", "queue", qa).stdout
        assert "cpu=5" in table and "map[" not in table, table
        view = debug_queues(sandbox)["queues"][qa]
        for field in ("allocated", "deserved", "dominantShare", "pending", "admitted"):
            assert view[field] == status[field], field
        samples = metrics(sandbox)
        assert samples[("arbiter_queue_allocated", (("queue", qa), ("resource", "cpu")))] == 5.0
        deserved_cpu = samples[("arbiter_queue_deserved", (("queue", qa), ("resource", "cpu")))]
        assert f"{deserved_cpu:g}" == status["deserved"]["cpu"]
        assert samples[("arbiter_queue_dominant_share", (("queue", qa),))] == 0.5
        assert samples[("arbiter_queue_pending_units", (("queue", qa),))] == 15.0
        assert samples[("arbiter_admitted_units_total", (("queue", qa),))] == 5.0
        assert samples[("arbiter_leader", ())] == 1.0
        events = get(sandbox, "events", "-n", qa)["items"]
        reasons = {(e["involvedObject"]["kind"], e["reason"]) for e in events}
        assert {("Pod", "Admitted"), ("Pod", "Waiting")} <= reasons


def test_weights_two_to_one_admit_in_that_ratio(sandbox: Sandbox) -> None:
    tag = suffix()
    heavy, light, qh = f"heavy-{tag}", f"light-{tag}", f"hold-{tag}"
    with scenario(sandbox, {heavy: {"namespaces": [heavy], "weight": 2},
                            light: {"namespaces": [light], "weight": 1},
                            qh: {"namespaces": [qh]}}, [heavy, light, qh]):
        hold_cluster(sandbox, qh, qh)
        create(sandbox, *(pod(f"p{i:02d}", ns) for i in range(15) for ns in (heavy, light)))
        wait_for("30 units", lambda: len(units(sandbox, heavy)) + len(units(sandbox, light))
                 == 30)
        let_go(sandbox, qh)
        wait_for("10 pods released", lambda: len(released(sandbox, heavy))
                 + len(released(sandbox, light)) == CPUS)
        got = {heavy: len(released(sandbox, heavy)), light: len(released(sandbox, light))}
        assert abs(got[heavy] - CPUS * 2 / 3) <= 1
        prediction = fairshare(sandbox, {heavy: ({"weight": 2}, 15), light: ({"weight": 1}, 15)})
        assert got == {name: prediction["queues"][name]["admitted"] for name in got}


def test_finished_jobs_make_room_for_the_next_in_order(sandbox: Sandbox) -> None:
    tag = suffix()
    qj, qh = f"jobs-{tag}", f"hold-{tag}"
    with scenario(sandbox, {qj: {"namespaces": [qj], "queuePolicy": "FIFO"},
                            qh: {"namespaces": [qh]}}, [qj, qh]):
        # Leave 3 CPUs: the six Jobs go in two waves.
        hold_cluster(sandbox, qh, qh, CPUS - 3)
        create(sandbox, *(job(f"j{index}", qj, runs_for="4s") for index in range(6)))

        def running() -> set[str]:
            return {j["metadata"]["name"] for j in get(sandbox, "jobs", "-n", qj)["items"]
                    if not j["spec"].get("suspend")}

        def first_wave() -> set[str] | None:
            now_running = running()
            return now_running if len(now_running) >= 3 else None

        first = wait_for("the first wave", first_wave)
        assert first == {"j0", "j1", "j2"}  # FIFO: creation time, then name

        def all_done() -> list[dict[str, Any]] | None:
            jobs = get(sandbox, "jobs", "-n", qj)["items"]
            done = [j for j in jobs if job_complete(j)]
            return jobs if len(done) == 6 else None

        jobs = wait_for("all six Jobs complete, no poke needed", all_done, timeout=120)
        finished_at = {j["metadata"]["name"]: j["status"]["completionTime"] for j in jobs}
        by_unit = {u["metadata"]["name"]: u for u in units(sandbox, qj)}
        assert {by_unit[f"job-j{i}"]["status"]["phase"] for i in range(6)} == {"Succeed"}
        admitted_at = [by_unit[f"job-j{i}"]["status"]["lastAllocateTime"] for i in range(6)]
        assert admitted_at == sorted(admitted_at)  # in order
        first_done = min(finished_at[f"j{i}"] for i in range(3))
        assert all(at >= first_done for at in admitted_at[3:])  # each waited for room
        assert all(len(admissions(u)) == 1 for u in by_unit.values())


def test_a_guarantee_is_honoured(sandbox: Sandbox) -> None:
    tag = suffix()
    sure, other, qh = f"sure-{tag}", f"other-{tag}", f"hold-{tag}"
    with scenario(sandbox, {sure: {"namespaces": [sure], "guarantee": {"cpu": "7"}},
                            other: {"namespaces": [other]},
                            qh: {"namespaces": [qh]}}, [sure, other, qh]):
        hold_cluster(sandbox, qh, qh)
        create(sandbox, *(pod(f"p{i:02d}", ns) for i in range(10) for ns in (other, sure)))
        wait_for("20 units", lambda: len(units(sandbox, sure)) + len(units(sandbox, other))
                 == 20)
        let_go(sandbox, qh)
        wait_for("10 pods released", lambda: len(released(sandbox, sure))
                 + len(released(sandbox, other)) == CPUS)
        assert len(released(sandbox, sure)) == 7  # without the guarantee: 5
        prediction = fairshare(sandbox, {sure: ({"guarantee": {"cpu": "7"}}, 10),
                                         other: ({}, 10)})
        assert prediction["queues"][sure]["admitted"] == 7


def test_a_capability_is_never_exceeded(sandbox: Sandbox) -> None:
    tag = suffix()
    capped = f"capped-{tag}"
    with scenario(sandbox, {capped: {"namespaces": [capped], "capability": {"cpu": "3"}}},
                  [capped]):
        create(sandbox, *(pod(f"p{i:02d}", capped) for i in range(8)))
        wait_for("3 released", lambda: len(released(sandbox, capped)) == 3)
        for _ in range(8):
            time.sleep(0.5)
            assert len(released(sandbox, capped)) == 3
        gone = released(sandbox, capped)[0]
        sandbox.kubectl("delete", "pod", gone, "-n", capped, "--grace-period=0", "--force")
        wait_for("another released in its place",
                 lambda: len(released(sandbox, capped)) == 3 and gone not in released(
                     sandbox, capped))
        time.sleep(2)
        assert len(released(sandbox, capped)) == 3
        reason = debug_queues(sandbox)["queues"][capped]["reason"]
        assert reason == "queue at capability (cpu)"


def test_sigkill_mid_run_admits_every_unit_exactly_once(sandbox: Sandbox) -> None:
    tag = suffix()
    qk = f"crash-{tag}"
    jobs = 24
    with scenario(sandbox, {qk: {"namespaces": [qk]}}, [qk]):
        create(sandbox, *(job(f"j{i:02d}", qk, runs_for="3s") for i in range(jobs)))
        wait_for("the first wave admitted", lambda: sum(
            1 for u in units(sandbox, qk) if admissions(u)) >= CPUS)
        sandbox.kill_arbiter()
        sandbox.start_arbiter()  # waits out the dead leader's Lease, then rebuilds

        def finished() -> list[dict[str, Any]] | None:
            items = units(sandbox, qk)
            done = [u for u in items if (u.get("status") or {}).get("phase") == "Succeed"]
            return items if len(done) == jobs else None

        items = wait_for(f"all {jobs} Jobs finished", finished, timeout=240, poll=1.0)
        counts = sorted(len(admissions(u)) for u in items)
        assert counts == [1] * jobs  # none twice, none lost
        leaders = {a.get("by") for u in items for a in admissions(u)}
        assert len(leaders) == 2  # before and after the crash


def test_only_the_lease_holder_admits_and_a_standby_takes_over(sandbox: Sandbox) -> None:
    tag = suffix()
    qr = f"replicas-{tag}"
    replica = "arbiter-replica"
    with scenario(sandbox, {qr: {"namespaces": [qr]}}, [qr]):
        first = lease_holder(sandbox)
        assert first
        sandbox.start_arbiter(name=replica)
        try:
            assert metrics(sandbox, replica)[("arbiter_leader", ())] == 0.0
            create(sandbox, *(pod(f"p{i:02d}", qr) for i in range(14)))
            wait_for("10 released", lambda: len(released(sandbox, qr)) == CPUS)
            time.sleep(1)
            by = {a.get("by") for u in units(sandbox, qr) for a in admissions(u)}
            assert by == {first}  # the standby admitted nothing

            sandbox.kill_arbiter()  # no release: the standby waits the Lease out
            second = wait_for("the standby holds the Lease", lambda: (
                holder if (holder := lease_holder(sandbox)) not in ("", first) else None),
                timeout=40)
            wait_for("the standby leads", lambda: metrics(sandbox, replica)[
                ("arbiter_leader", ())] == 1.0)
            # The webhook URL is the primary's: bring it back (as a follower).
            sandbox.start_arbiter()
            for name in released(sandbox, qr)[:2]:
                sandbox.kubectl("delete", "pod", name, "-n", qr, "--grace-period=0", "--force")
            wait_for("two more released", lambda: len(released(sandbox, qr)) == CPUS)
            newer = {a.get("by") for u in units(sandbox, qr) for a in admissions(u)}
            assert newer == {first, second}
            assert lease_holder(sandbox) == second
            assert metrics(sandbox)[("arbiter_leader", ())] == 0.0
        finally:
            sandbox.stop_arbiter(replica)  # SIGTERM releases the Lease
        wait_for("the primary leads again",
                 lambda: metrics(sandbox)[("arbiter_leader", ())] == 1.0, timeout=30)


@pytest.fixture(autouse=True)
def _arbiter_running(sandbox: Sandbox) -> Iterator[None]:
    """Whatever a test did to the primary, the next one finds it running."""
    yield
    status, _ = arbiter_get(sandbox, "/healthz")
    if status != 200:
        sandbox.start_arbiter()


def test_a_gpu_only_in_limits_is_demanded_and_not_admitted_without_gpus(
        sandbox: Sandbox) -> None:
    """Issue 13, item 12: the apiserver does not default a Job's pod template,
    so a GPU set only in limits must still reach the unit's demand."""
    with tenant(sandbox, "gpu") as (ns, _):
        manifest = job("gpu", ns)
        manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
        create(sandbox, manifest)
        unit = wait_for("the Job's QueueUnit", lambda: next(iter(units(sandbox, ns)), None))
        assert unit["spec"]["podSets"][0]["requests"].get("nvidia.com/gpu") == "1", unit["spec"]
        time.sleep(5)  # a few loop cycles: the sandbox's nodes have no GPU
        assert get(sandbox, "job", "gpu", "-n", ns)["spec"].get("suspend") is True
        phase = (units(sandbox, ns)[0].get("status") or {}).get("phase")
        assert phase not in ("Dequeued", "Running"), phase
