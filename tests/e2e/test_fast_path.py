"""Admission at creation (DESIGN §16) on the real control plane: a Job into
an empty queue runs without ever being suspended; behind a waiting unit it
is held as before; it is on by default (`--admit-on-create=false` holds
every Job); and a leader SIGKILLed between the webhook's answer and the
unit's write loses nothing and admits nothing twice."""

from __future__ import annotations

import json
import time
from typing import Any

from arbiter.cache.convert import unit_status
from arbiter.core.fastpath import FAST_PATH_ANNOTATION
from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    arbiter_with,
    get,
    hold_cluster,
    job,
    job_complete,
    let_go,
    metrics,
    tenant,
    units,
    wait_for,
)


def created(sandbox: Sandbox, obj: dict[str, Any]) -> dict[str, Any]:
    """`kubectl create` of one object: the object as the apiserver stored it."""
    out = sandbox.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(obj)).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def phase(unit: dict[str, Any]) -> str:
    return str(unit_status(unit).get("phase") or "Enqueued")


def suspend_writers(sandbox: Sandbox, ns: str, name: str) -> list[str]:
    """Field managers that wrote spec.suspend after the Job's creation (its
    creator, kubectl, owns what the mutating webhook set at creation)."""
    job_obj = get(sandbox, "job", name, "-n", ns, "--show-managed-fields")
    entries = job_obj["metadata"].get("managedFields") or []
    assert entries, "the apiserver keeps managedFields"
    return [entry.get("manager", "") for entry in entries
            if entry.get("manager") != "kubectl-create"
            and "f:suspend" in json.dumps(entry.get("fieldsV1") or {})]


def leads(sandbox: Sandbox) -> bool:
    try:
        return metrics(sandbox)[("arbiter_leader", ())] == 1.0
    except (AssertionError, OSError, KeyError):
        return False


# The default (`--admit-on-create`): said where the arbiter is restarted.
FAST_PATH = "--admit-on-create=true"


def admitted_on_record(sandbox: Sandbox, ns: str, name: str) -> dict[str, Any] | None:
    """The unit's status as stored, once the loop wrote its admission there
    (the fields a held admission writes)."""
    status = get(sandbox, "queueunit", name, "-n", ns).get("status") or {}
    return status if status.get("admissions") and status.get("lastAllocateTime") \
        and status.get("allocated") and status.get("admission") else None


def test_a_job_into_an_empty_queue_runs_without_ever_being_suspended(sandbox: Sandbox) -> None:
    with tenant(sandbox, "fast") as (ns, _):
        stored = created(sandbox, job("train", ns, runs_for="2s"))
        assert stored["spec"]["suspend"] is False
        assert FAST_PATH_ANNOTATION in stored["metadata"]["annotations"]
        unit = wait_for("its unit, admitted", lambda: next(
            (u for u in units(sandbox, ns) if phase(u) in ("Dequeued", "Running", "Succeed")),
            None), timeout=30)
        assert unit["metadata"]["name"] == "job-train"
        assert len(unit_status(unit)["admissions"]) == 1
        status = wait_for("its admission in its status", lambda: admitted_on_record(
            sandbox, ns, "job-train"), timeout=30)
        assert len(status["admissions"]) == 1 and status["allocated"] == {"cpu": "1"}, status
        done = wait_for("the Job complete", lambda: (
            lambda j: j if job_complete(j) else None)(get(sandbox, "job", "train", "-n", ns)),
            timeout=30)
        # Never suspended: the spec is the one created (generation 1), and no
        # update ever wrote spec.suspend.
        assert done["metadata"]["generation"] == 1
        assert suspend_writers(sandbox, ns, "train") == []
        events = get(sandbox, "events", "-n", ns)["items"]
        assert any(e["reason"] == "Admitted" and "at creation" in e["message"] for e in events)


def test_behind_a_waiting_unit_a_job_is_held_as_before(sandbox: Sandbox) -> None:
    with tenant(sandbox, "held", blocking=True) as (ns, queue_name):
        hold_cluster(sandbox, ns, queue_name, cpus=9)
        two = job("head", ns, runs_for="2s")  # two 1-CPU pods; one CPU is free
        two["spec"].update(parallelism=2, completions=2)
        head = created(sandbox, two)
        assert head["spec"]["suspend"] is True
        wait_for("the head waiting", lambda: any(
            u["metadata"]["name"] == "job-head" for u in units(sandbox, ns)), timeout=30)
        # One CPU is free and would fit, but the blocked head comes first.
        behind = created(sandbox, job("behind", ns, runs_for="2s"))
        assert behind["spec"]["suspend"] is True
        assert FAST_PATH_ANNOTATION not in (behind["metadata"].get("annotations") or {})
        let_go(sandbox, ns)
        for name in ("head", "behind"):
            wait_for(f"{name} complete", lambda: job_complete(
                get(sandbox, "job", name, "-n", ns)), timeout=45)  # noqa: B023 (waited here)
        assert suspend_writers(sandbox, ns, "behind") == ["kube-arbiter"]


def test_the_fast_path_is_on_by_default(sandbox: Sandbox) -> None:
    with tenant(sandbox, "default") as (ns, _):
        assert created(sandbox, job("quick", ns, runs_for="1s"))["spec"]["suspend"] is False
    with arbiter_with(sandbox, ["--admit-on-create=false"]), tenant(sandbox, "off") as (ns, _):
        held = created(sandbox, job("held", ns, runs_for="1s"))
        assert held["spec"]["suspend"] is True
        wait_for("held, then admitted by the loop", lambda: job_complete(
            get(sandbox, "job", "held", "-n", ns)), timeout=45)


def test_a_leader_killed_after_the_webhook_answered_loses_and_doubles_nothing(
        sandbox: Sandbox) -> None:
    with tenant(sandbox, "crash") as (ns, _):
        sandbox.stop_arbiter()
        # The loop waits 60 s before writing a unit admitted at creation:
        # the kill lands between the webhook's answer and that write.
        sandbox.start_arbiter([FAST_PATH, "--test-fast-path-unit-delay=60"])
        try:
            wait_for("arbiter leads", lambda: leads(sandbox), timeout=60)
            # It runs long enough for the new leader (after the Lease expires) to see it.
            stored = created(sandbox, job("survivor", ns, runs_for="60s"))
            assert stored["spec"]["suspend"] is False
            sandbox.kill_arbiter()
            assert units(sandbox, ns) == []
        finally:
            sandbox.stop_arbiter()  # gone already after the kill: nothing to do
            sandbox.start_arbiter([FAST_PATH])
        wait_for("arbiter leads again", lambda: leads(sandbox), timeout=60)
        # Adopted: its unit written admitted, once.
        found = wait_for("its unit, admitted", lambda: [
            u for u in units(sandbox, ns) if phase(u) in ("Dequeued", "Running")], timeout=30)
        assert [u["metadata"]["name"] for u in found] == ["job-survivor"]
        assert len(unit_status(found[0])["admissions"]) == 1
        wait_for("its pod running", lambda: [
            p for p in get(sandbox, "pods", "-n", ns)["items"]
            if p["status"].get("phase") == "Running"], timeout=30)
        # Written when the Job ends or a minute after its unit's creation.
        wait_for("its admission in its status", lambda: admitted_on_record(
            sandbox, ns, "job-survivor"), timeout=90)
        time.sleep(2.0)  # anything admitted twice would have been written by now
        assert len(units(sandbox, ns)) == 1
        assert suspend_writers(sandbox, ns, "survivor") == []
        pods = get(sandbox, "pods", "-n", ns)["items"]
        assert len(pods) == 1  # ran once
