"""Admission at creation (DESIGN §16): the leader's webhook question, the
reservation, the unit created admitted in one write, expiry, adoption by a
new leader, and no double booking with a normal cycle."""

from __future__ import annotations

from typing import Any

from arbiter.base.kubeapi import job_path, unit_path
from arbiter.core.api import QUEUE_LABEL, format_rfc3339
from arbiter.core.fastpath import FAST_PATH_ANNOTATION, derive_key
from arbiter.loop.controller import AdmissionController
from arbiter.loop.decisions import RECENT
from arbiter.loop.inflight import ASSUME_TTL
from arbiter.loop.settings import LoopSettings
from arbiter.testing.memory import json_patch
from tests.loop.harness import Cluster

KEY = derive_key(b"test CA key")


def job_obj(namespace: str, name: str, queue: str, *, cpu: str = "1",
            parallelism: int = 1) -> dict[str, Any]:
    """A Job as the mutating webhook sees it (not suspended by its user)."""
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE_LABEL: queue}},
        "spec": {"parallelism": parallelism,
                 "template": {"metadata": {"labels": {QUEUE_LABEL: queue}},
                              "spec": {"containers": [{"name": "c", "image": "x",
                                                       "resources": {"requests": {"cpu": cpu}}}]}}},
    }


async def create(c: Cluster, namespace: str, name: str, queue: str,
                 controller: AdmissionController | None = None,
                 **kwargs: Any) -> dict[str, Any] | None:
    """Ask the webhook's question, then create the Job as the apiserver
    would: patched and unsuspended (fast path), or suspended. The ops, or
    None for the held path."""
    obj = job_obj(namespace, name, queue, **kwargs)
    ops = (controller or c.controller).admit_on_create(namespace, name, queue, obj)
    if ops is None:
        obj["spec"]["suspend"] = True
    else:
        obj = json_patch(obj, ops)
        obj["spec"]["suspend"] = False
    await c.api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", obj)
    return {"ops": ops} if ops is not None else None


def unit_phase(c: Cluster, namespace: str, name: str) -> str | None:
    record = c.store.units.get(f"{namespace}/{name}")
    return record.phase if record is not None else None


async def ready(nodes: int = 2, settings: LoopSettings | None = None) -> Cluster:
    """A cluster with the fast path's key: `nodes` nodes and queue `q`, settled."""
    c = Cluster(settings, fast_path_key=KEY)
    await c.nodes(nodes)
    await c.queue("q")
    await c.settle()
    return c


def reserve(c: Cluster, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Job `name` of queue q in ns let through at creation: the room is
    reserved. The Job as its user wrote it, and the webhook's ops."""
    obj = job_obj("ns", name, "q")
    ops = c.controller.admit_on_create("ns", name, "q", obj)
    assert ops is not None
    return obj, ops


async def test_a_job_into_an_empty_queue_is_admitted_at_creation_in_one_write() -> None:
    c = await ready()
    assert await create(c, "ns", "train", "q") is not None
    assert not c.suspended("ns", "train")
    job = c.api.objects[job_path("ns", "train")]
    assert job["metadata"]["annotations"][FAST_PATH_ANNOTATION].startswith("v1;job-train;q;")
    before = len(c.api.calls)
    await c.settle()
    writes = [(m, p) for m, p in c.api.calls[before:] if m in ("POST", "PATCH", "PUT")]
    # One write admits: the unit, admitted (in an annotation); no unsuspend.
    assert writes == [("POST", unit_path("ns"))]
    record = c.store.units["ns/job-train"]
    assert record.phase == "Dequeued" and record.admissions == 1 and record.attempts == 1
    assert record.unwritten
    # Its status is written once, with the phase its Job reached by then:
    # admission and phase together (a Job that ends first: at its end).
    c.run_job("ns", "train")
    await c.settle()
    assert [(m, p) for m, p in c.api.calls[before:] if m in ("POST", "PATCH", "PUT")] == writes
    c.clock.advance(c.settings.record_within)
    c.controller.wake()
    await c.settle()
    writes = [(m, p) for m, p in c.api.calls[before:] if m in ("POST", "PATCH", "PUT")]
    assert writes[1:] == [("PATCH", unit_path("ns", "job-train", status=True))]
    record = c.store.units["ns/job-train"]
    assert record.phase == "Running" and record.admissions == 1 and not record.unwritten
    assert c.controller.mirror.state("ns/job-train") == "admitted"
    assert not c.controller.fast.reservations
    assert "Admitted" in c.events.reasons("ns/job-train")
    assert any(r.unit == "ns/job-train" and ("path", "creation") in r.fields for r in RECENT)


async def test_with_a_waiting_unit_ahead_the_job_is_held() -> None:
    c = await ready(1)
    await c.job("ns", "first", "q")
    await c.job("ns", "big", "q", cpu="2")  # waits: no node has 2 CPUs
    await c.settle()
    assert unit_phase(c, "ns", "job-big") == "Enqueued"
    # A 1-CPU Job: the node is taken by "first"; nothing fits: held.
    assert await create(c, "ns", "small", "q") is None
    await c.settle()
    assert c.suspended("ns", "small")


async def test_a_blocking_queue_with_a_waiting_head_holds_new_jobs() -> None:
    c = Cluster(fast_path_key=KEY)
    await c.nodes(2)
    await c.queue("q", blocking=True)
    await c.job("ns", "big", "q", cpu="4")  # its head cannot fit: the queue is blocked
    await c.settle()
    assert await create(c, "ns", "small", "q") is None


async def test_another_queue_owed_the_room_first_is_served_first() -> None:
    c = Cluster(fast_path_key=KEY)
    await c.nodes(1)
    await c.queue("a")
    await c.queue("b")
    await c.job("ns", "a1", "a")
    await c.settle()  # a holds the node
    await c.job("nb", "b1", "b")  # waits
    await c.settle()
    c.finish_job("ns", "a1")
    # Before the loop sees the room, a new Job of queue a asks: the engine is
    # brought up to date first, and b (lower share) gets the room.
    assert await create(c, "ns", "a2", "a") is None
    await c.settle()
    assert not c.suspended("nb", "b1")
    assert c.suspended("ns", "a2")


async def test_a_reservation_whose_job_never_comes_expires() -> None:
    c = await ready(1)
    obj, ops = reserve(c, "ghost")
    # The room is reserved: a Job created meanwhile through the held path waits.
    await c.job("ns", "other", "q")
    await c.settle()
    assert c.suspended("ns", "other")
    c.clock.advance(ASSUME_TTL + 1)
    c.controller.wake()
    await c.settle()
    assert not c.controller.fast.reservations
    assert not c.suspended("ns", "other")
    # The Job comes after all (a watch lagging that long): it runs, so it
    # is counted admitted from now.
    late = json_patch(obj, ops)
    late["metadata"]["creationTimestamp"] = format_rfc3339(c.clock() - ASSUME_TTL - 1)
    await c.api.create("/apis/batch/v1/namespaces/ns/jobs", late)
    await c.settle()
    assert c.store.units["ns/job-ghost"].phase == "Dequeued"
    assert any(r.unit == "ns/job-ghost" and "expired" in r.reason for r in RECENT)


async def test_the_reservation_and_a_normal_cycle_never_book_the_room_twice() -> None:
    c = await ready(1)
    obj, ops = reserve(c, "fast")
    await c.job("ns", "slow", "q")
    c.controller.cycle()  # before the fast Job's watch event
    obj = json_patch(obj, ops)
    await c.api.create("/apis/batch/v1/namespaces/ns/jobs", obj)
    await c.settle()
    assert unit_phase(c, "ns", "job-fast") == "Dequeued"
    assert c.suspended("ns", "slow") and unit_phase(c, "ns", "job-slow") == "Enqueued"


async def test_a_new_leader_adopts_a_job_let_through_by_the_old_one() -> None:
    c = await ready()
    old = c.controller
    assert await create(c, "ns", "train", "q", controller=old) is not None
    old.stop_listening()
    await old.close()  # killed before it wrote the unit
    assert "ns/job-train" not in c.store.units
    new = c.new_controller("replica-b")
    await c.settle(new)
    record = c.store.units["ns/job-train"]
    assert record.phase == "Dequeued" and record.attempts == 1
    assert new.mirror.state("ns/job-train") == "admitted"
    assert any(r.unit == "ns/job-train" and "adopted" in r.reason for r in RECENT)
    posts = [p for m, p in c.api.calls if m == "POST" and p == unit_path("ns")]
    assert len(posts) == 1  # nothing admitted twice


async def test_a_forged_token_is_not_an_admission_at_creation() -> None:
    c = await ready()
    obj = job_obj("ns", "forged", "q")
    obj["metadata"]["annotations"] = {
        FAST_PATH_ANNOTATION: f"v1;job-forged;q;;{int(c.clock() * 1000)};{'0' * 32}"}
    obj["spec"]["suspend"] = False  # past a bypassed webhook
    await c.api.create("/apis/batch/v1/namespaces/ns/jobs", obj)
    await c.settle()
    # Not created admitted: the held path's record of a Job released outside arbiter.
    assert not any(r.unit == "ns/job-forged" and ("path", "creation") in r.fields
                   for r in RECENT)
    assert c.unit_obj("ns", "job-forged")["status"]["message"].startswith("released outside")


async def test_the_flag_off_holds_every_job() -> None:
    c = await ready(settings=LoopSettings(debounce=0.0, admit_on_create=False))
    assert await create(c, "ns", "train", "q") is None


async def test_dry_runs_generate_names_and_taken_names_are_held() -> None:
    c = await ready()
    await c.job("ns", "taken", "q")
    await c.settle()
    assert c.controller.admit_on_create("ns", "", "q", job_obj("ns", "", "q")) is None
    assert c.controller.admit_on_create("ns", "taken", "q", job_obj("ns", "taken", "q")) is None
    # Partially admissible Jobs (min-parallelism) take the held path too.
    partial = job_obj("ns", "part", "q", parallelism=2)
    partial["metadata"]["annotations"] = {"arbiter.dev/min-parallelism": "1"}
    assert c.controller.admit_on_create("ns", "part", "q", partial) is None


async def test_a_job_held_before_and_not_seen_yet_comes_first() -> None:
    """A Job the webhook held whose unit the engine has not seen yet counts
    as pending ahead: the room it would take is not given to a later Job."""
    for nodes, later_fast in ((1, False), (2, True)):
        c = await ready(nodes)
        first = job_obj("ns", "first", "q")
        first["spec"]["suspend"] = True  # its user suspended it: held, with a unit to come
        assert c.controller.admit_on_create("ns", "first", "q", first) is None
        later = c.controller.admit_on_create("ns", "later", "q", job_obj("ns", "later", "q"))
        assert (later is not None) is later_fast
        assert c.controller.mirror.state("ns/job-first") is None  # counted, not kept
