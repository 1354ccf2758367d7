"""Kubernetes Events: shape, targets, de-duplication, rate, overflow."""

from __future__ import annotations

import asyncio

from arbiter.cache.records import OwnerRef, PodSet, UnitRecord
from arbiter.core.resources import Resources
from arbiter.loop.events import EventRecorder
from arbiter.testing.memory import InMemoryApi
from tests.loop.harness import Clock


def job_unit() -> UnitRecord:
    return UnitRecord(uid="u-unit", namespace="ns", name="job-train", queue="q",
                      pod_sets=(PodSet("main", 1, Resources({"cpu": 1000})),),
                      consumer=OwnerRef("Job", "train", "u-job"))


async def test_admitted_goes_to_the_job_and_its_unit() -> None:
    api = InMemoryApi()
    recorder = EventRecorder(api, instance="me", clock=Clock())
    recorder.unit_event(job_unit(), "Normal", "Admitted", "admitted by queue q")
    await recorder.flush()
    events = api.of_kind("events")
    assert sorted(e["involvedObject"]["kind"] for e in events) == ["Job", "QueueUnit"]
    job_event = next(e for e in events if e["involvedObject"]["kind"] == "Job")
    assert job_event["involvedObject"] == {"apiVersion": "batch/v1", "kind": "Job",
                                           "namespace": "ns", "name": "train", "uid": "u-job"}
    assert job_event["metadata"]["namespace"] == "ns"
    assert job_event["metadata"]["name"].startswith("train.")
    assert (job_event["reason"], job_event["type"], job_event["count"]) == (
        "Admitted", "Normal", 1)
    assert job_event["source"] == {"component": "kube-arbiter", "host": "me"}
    assert job_event["firstTimestamp"] == job_event["lastTimestamp"]


async def test_waiting_goes_to_the_consumer_only_and_repeats_are_dropped() -> None:
    api, clock = InMemoryApi(), Clock()
    recorder = EventRecorder(api, clock=clock)
    for _ in range(3):
        recorder.unit_event(job_unit(), "Normal", "Waiting", "cluster full", on_unit=False)
    recorder.unit_event(job_unit(), "Normal", "Waiting", "behind 2 units", on_unit=False)
    await recorder.flush()
    assert [e["message"] for e in api.of_kind("events")] == ["cluster full", "behind 2 units"]
    clock.advance(601)  # an old repeat is worth saying again
    recorder.unit_event(job_unit(), "Normal", "Waiting", "cluster full", on_unit=False)
    assert recorder.pending() == 1


async def test_the_sender_keeps_to_its_rate_and_a_full_queue_drops_the_oldest() -> None:
    api = InMemoryApi()
    recorder = EventRecorder(api, qps=1.0, burst=2, max_queue=3)
    for index in range(5):
        recorder.unit_event(job_unit(), "Normal", "Waiting", f"m{index}", on_unit=False)
    assert recorder.dropped == 2 and recorder.pending() == 3
    sender = asyncio.ensure_future(recorder.run())
    await asyncio.sleep(0.2)
    sender.cancel()
    assert [e["message"] for e in api.of_kind("events")] == ["m2", "m3"]  # the burst


async def test_events_stuck_behind_a_burst_for_too_long_are_dropped() -> None:
    api, clock = InMemoryApi(), Clock()
    recorder = EventRecorder(api, qps=1000.0, burst=1000, max_age=60.0, clock=clock)
    recorder.unit_event(job_unit(), "Normal", "Waiting", "old news", on_unit=False)
    clock.advance(61)
    recorder.unit_event(job_unit(), "Normal", "Admitted", "fresh", on_unit=False)
    sender = asyncio.ensure_future(recorder.run())
    await asyncio.sleep(0.05)
    sender.cancel()
    assert [e["message"] for e in api.of_kind("events")] == ["fresh"]
    assert recorder.dropped == 1
