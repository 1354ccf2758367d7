"""A unit created admitted (the fast path, DESIGN §16) ends up with the
status a held admission writes: its admission travels in an annotation
with the creation, then the loop writes it into the status (what kubectl,
the web view and every other reader of the object see), together with the
first phase its Job reaches (`LoopSettings.record_within`)."""

from __future__ import annotations

import json
from typing import Any

from arbiter.base.kubeapi import ApiError, job_path, unit_path
from arbiter.cache.convert import unit_from_api, unit_status
from arbiter.core.api import ADMITTED_STATUS_ANNOTATION
from arbiter.loop.evict import Evictor
from arbiter.loop.settings import LoopSettings
from tests.loop.harness import Cluster
from tests.loop.test_fastpath import KEY, create, ready
from tests.loop.test_placement import node, pool, publish

ADMITTED_FIELDS = ("phase", "admissions", "attempts", "lastAllocateTime", "allocated",
                   "message")


def written(c: Cluster, ns: str, name: str) -> dict[str, Any]:
    """The unit's status as stored (not the cache's merged view)."""
    return dict(c.unit_obj(ns, name).get("status") or {})


async def record_within_over(c: Cluster) -> None:
    """The time a unit created admitted waits for its Job to run, over."""
    c.clock.advance(c.settings.record_within)
    c.controller.wake()
    await c.settle()


async def test_the_admission_is_written_into_the_status_of_a_unit_created_admitted() -> None:
    """Its Job not running within `record_within`: the admission alone."""
    c = await ready()
    assert await create(c, "ns", "train", "q") is not None
    await c.settle()
    assert written(c, "ns", "job-train") == {}  # the annotation stands in
    c.clock.advance(c.settings.record_within - 1)
    c.controller.wake()
    await c.settle()
    assert written(c, "ns", "job-train") == {}
    await record_within_over(c)
    status = written(c, "ns", "job-train")
    assert all(field in status for field in ADMITTED_FIELDS), status
    assert status["phase"] == "Dequeued" and len(status["admissions"]) == 1
    assert status["allocated"] == {"cpu": "1"} and status["attempts"] == 1
    assert status["admission"]["nodes"]["main"][0] in ("node-0", "node-1"), status
    assert not c.store.units["ns/job-train"].unwritten
    # The same status a held Job's admission writes (times and names aside).
    await c.job("ns", "held", "q")
    await c.settle()
    assert set(written(c, "ns", "job-held")) == set(status)


async def test_a_job_that_ends_before_it_was_seen_running_is_written_ended_in_one_write() -> None:
    c = await ready()
    assert await create(c, "ns", "quick", "q") is not None
    await c.settle()
    c.finish_job("ns", "quick")
    await c.settle()
    status = written(c, "ns", "job-quick")
    assert status["phase"] == "Succeed" and len(status["admissions"]) == 1, status
    assert status["allocated"] == {"cpu": "1"} and status["attempts"] == 1, status
    assert c.api.calls.count(("PATCH", unit_path("ns", "job-quick", status=True))) == 1


async def test_a_job_finished_before_its_unit_was_written_gives_its_room_back() -> None:
    """A finished Job needs no unit: the room reserved for it at creation is
    free at once (not while the Job object stays, nor after the reservation's
    time)."""
    c = await ready(1)
    assert await create(c, "ns", "quick", "q") is not None
    c.finish_job("ns", "quick")
    await c.settle()
    assert not c.controller.fast.reservations
    assert c.controller.mirror.state("ns/job-quick") is None
    assert await create(c, "ns", "next", "q") is not None


async def test_a_unit_written_admitted_then_its_job_finished_keeps_its_admission() -> None:
    c = await ready()
    assert await create(c, "ns", "quick", "q") is not None
    await c.settle()
    await record_within_over(c)  # written Dequeued, its Job not running yet
    assert written(c, "ns", "job-quick")["phase"] == "Dequeued"
    c.finish_job("ns", "quick")
    await c.settle()
    status = written(c, "ns", "job-quick")
    assert status["phase"] == "Succeed", status
    assert len(status["admissions"]) == 1 and status["lastAllocateTime"], status


async def test_a_unit_created_admitted_counts_in_its_queue_and_pool_and_is_placed() -> None:
    c = Cluster(fast_path_key=KEY)
    await node(c, "a0", tier="fast")
    await node(c, "b0")
    await pool(c, "fast", {"tier": "fast"})
    await c.queue("q", pools=["fast"])
    await c.settle()
    assert await create(c, "ns", "j", "q") is not None
    await c.settle()
    await record_within_over(c)
    template = c.api.objects[job_path("ns", "j")]["spec"]["template"]["spec"]
    assert template["nodeSelector"] == {"tier": "fast"}
    status = written(c, "ns", "job-j")
    assert status["admission"]["pool"] == "fast" and status["admission"]["nodes"] == {
        "main": ["a0"]}, status
    await publish(c)
    queue = c.queue_status("q")
    assert queue["allocated"] == {"cpu": "1"} and queue["admitted"] == 1, queue
    assert queue["pools"] == [{"name": "fast", "admitted": 1, "allocated": {"cpu": "1"}}]


def test_the_annotation_stands_in_only_until_the_status_is_written() -> None:
    recorded = '{"phase":"Dequeued","admissions":[{"attempt":1}],"allocated":{"cpu":"1"}}'
    obj: dict[str, Any] = {
        "metadata": {"name": "u", "namespace": "ns", "uid": "1",
                     "annotations": {ADMITTED_STATUS_ANNOTATION: recorded}},
        "spec": {"queue": "q"}, "status": {"phase": "Running"}}
    assert unit_status(obj)["admissions"] == [{"attempt": 1}]
    assert unit_from_api(obj).unwritten and unit_from_api(obj).admissions == 1
    # Written, then requeued (allocated removed): nothing comes back from it.
    obj["status"] = {"phase": "Enqueued", "admissions": [{"attempt": 1}]}
    assert unit_status(obj) == obj["status"]
    assert not unit_from_api(obj).unwritten
    # One that holds no admission is not a record of one.
    obj["metadata"]["annotations"][ADMITTED_STATUS_ANNOTATION] = '{"phase":"Dequeued"}'
    obj["status"] = {}
    assert unit_status(obj) == {} and not unit_from_api(obj).unwritten


async def test_admission_and_phase_are_one_write_from_the_created_object() -> None:
    """Its Job runs: once `record_within` is over, one status write carries
    the admission and phase Running, built from what the creation returned."""
    c = await ready()
    assert await create(c, "ns", "train", "q") is not None
    await c.settle()
    c.run_job("ns", "train")
    await record_within_over(c)
    unit = unit_path("ns", "job-train")
    assert ("GET", unit) not in c.api.calls
    assert c.api.calls.count(("PATCH", unit_path("ns", "job-train", status=True))) == 1
    status = written(c, "ns", "job-train")
    assert status["phase"] == "Running" and status["message"] == "running", status
    assert len(status["admissions"]) == 1 and status["admission"]["nodes"], status


async def test_a_status_write_that_failed_is_done_on_the_units_next_look() -> None:
    """Its status write fails (or its leader dies before it): the unit's
    next look reads it and writes it, before anything else."""
    c = await ready()
    failed: list[str] = []

    def fail_once(method: str, path: str, body: Any) -> ApiError | None:
        if method == "PATCH" and path == unit_path("ns", "job-train", status=True) \
                and not failed:
            failed.append(path)
            return ApiError(500, "InternalError", "etcd is away")
        return None

    c.api.hooks.append(fail_once)
    assert await create(c, "ns", "train", "q") is not None
    await c.settle()
    c.run_job("ns", "train")
    await record_within_over(c)
    assert failed
    c.clock.advance(5)
    c.controller.wake()
    await c.settle()
    status = written(c, "ns", "job-train")
    assert status["phase"] == "Running" and len(status["admissions"]) == 1, status
    assert status["lastAllocateTime"] and status["allocated"] == {"cpu": "1"}, status
    assert ("GET", unit_path("ns", "job-train")) in c.api.calls  # what it failed with is gone


async def test_a_job_admitted_at_creation_times_out_and_is_admitted_again_elsewhere() -> None:
    """Pool a's node turns out unusable: the Job admitted into a at
    creation times out, is suspended and requeued, and is admitted again
    into pool b, its template given b's selector in place of a's."""
    c = Cluster(LoopSettings(debounce=0.0, admit_on_create=True, admission_timeout=10.0,
                             backoff_base=1.0, backoff_max=1.0, record_within=0.0),
                fast_path_key=KEY)
    await node(c, "a0", tier="a")
    await node(c, "b0", tier="b")
    await pool(c, "a", {"tier": "a"})
    await pool(c, "b", {"tier": "b"})
    await c.queue("q", pools=["a", "b"])
    await c.settle()
    assert await create(c, "ns", "train", "q") is not None
    await c.settle()
    assert written(c, "ns", "job-train")["admission"]["pool"] == "a"
    await c.api.merge_patch("/api/v1/nodes/a0", {"spec": {"unschedulable": True}})
    for seconds in (11.0, 2.0):  # the admission times out; its backoff ends: admitted again
        c.clock.advance(seconds)
        c.controller.wake()
        await c.settle()
    status = written(c, "ns", "job-train")
    assert status["phase"] == "Dequeued" and status["admission"]["pool"] == "b", status
    assert len(status["admissions"]) == 2 and status["attempts"] == 2, status
    job = c.api.objects[job_path("ns", "train")]
    assert not job["spec"].get("suspend")
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"tier": "b"}
    placed = json.loads(job["metadata"]["annotations"]["arbiter.dev/placed"])
    assert placed["nodeSelector"] == {"tier": "b"}, placed


async def test_a_unit_taken_back_before_its_status_was_written_keeps_no_allocation() -> None:
    """Reclaimed (requeued) while its admission is still only in the
    annotation: the write carries the admission into the status and clears
    what a requeue clears, so nothing comes back from the annotation."""
    c = await ready()
    assert await create(c, "ns", "train", "q") is not None
    await c.settle()
    record = c.store.units["ns/job-train"]
    assert record.unwritten and written(c, "ns", "job-train") == {}
    requeued = await Evictor(c.api, c.controller.actions).requeue(record, "reclaimed")
    assert requeued is not None
    status = written(c, "ns", "job-train")
    assert status["phase"] == "Enqueued" and "allocated" not in status, status
    assert len(status["admissions"]) == 1 and status["attempts"] == 1, status
    fresh = unit_from_api(c.unit_obj("ns", "job-train"))
    assert not fresh.unwritten and fresh.phase == "Enqueued"
    assert unit_status(c.unit_obj("ns", "job-train")).get("allocated") is None
