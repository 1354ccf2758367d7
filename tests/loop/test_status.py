"""Queue status, positions and metrics: rendered from one view, rate-limited."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import yaml

from arbiter.base import metrics
from arbiter.core.resources import EMPTY, Resources
from arbiter.loop.follow import mirror_from_store
from arbiter.loop.settings import LoopSettings
from arbiter.loop.status import queue_views, summary
from arbiter.server.debug import pending_document, queues_document
from tests.loop.harness import Cluster


def sample(name: str, **labels: str) -> float | None:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return value


async def publish(c: Cluster) -> None:
    await c.controller.publisher.publish()
    await c.controller.writes.wait()


async def test_queue_status_metrics_and_debug_agree() -> None:
    c = Cluster()
    await c.nodes(10)
    await c.queue("sa", weight=1)
    await c.queue("sb", weight=1)
    await c.pods("ta", "sa", 20, prefix="a")
    await c.pods("tb", "sb", 20, prefix="b")
    await c.settle()
    await publish(c)
    status = c.queue_status("sa")
    assert status["allocated"] == {"cpu": "5"}
    assert status["deserved"] == {"cpu": "5"}
    assert status["dominantShare"] == 0.5
    assert (status["pending"], status["admitted"]) == (15, 5)
    assert status["pendingUnits"][0] == {"name": "pod-a-005", "namespace": "ta",
                                         "priority": 0, "position": 1}
    assert len(status["pendingUnits"]) == 10
    assert status["conditions"][0]["type"] == "Admitting"
    assert status["conditions"][0]["message"] == "cluster full (cpu)"

    assert sample("arbiter_queue_allocated", queue="sa", resource="cpu") == 5.0
    assert sample("arbiter_queue_deserved", queue="sa", resource="cpu") == 5.0
    assert sample("arbiter_queue_dominant_share", queue="sa") == 0.5
    assert sample("arbiter_queue_pending_units", queue="sa") == 15

    document = queues_document(c.controller.mirror, leader=True)
    view = document["queues"]["sa"]
    for field in ("allocated", "deserved", "dominantShare", "pending", "admitted",
                  "pendingUnits"):
        assert view[field] == status[field], field
    assert document["free"] == {"memory": "80Gi", "pods": "1100"}
    # A replica that does not lead rebuilds the same view from its cache.
    again = queues_document(mirror_from_store(c.store), leader=False)
    assert again["queues"] == document["queues"]


async def test_debug_pending_lists_the_queue_in_order_with_reasons() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q", capability={"cpu": "1"})
    await c.pods("ns", "q", 4)
    await c.settle()
    document = pending_document(c.controller.mirror, "q", 2)
    assert document is not None
    assert document["total"] == 3
    assert [(e["name"], e["position"]) for e in document["pending"]] == [
        ("pod-p-001", 1), ("pod-p-002", 2)]
    assert document["pending"][0]["reason"] == "queue at capability (cpu)"
    assert pending_document(c.controller.mirror, "nope", 2) is None


async def test_positions_are_written_and_cleared_on_admission() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    await c.pods("ns", "q", 3)
    await c.settle()
    await publish(c)
    # The head says why it waits (the queue's reason); the one behind it, nothing.
    assert c.unit_obj("ns", "pod-p-001")["status"] == {
        "position": 1, "phase": "Enqueued", "message": "waiting in queue q: cluster full (cpu)"}
    assert c.unit_obj("ns", "pod-p-002")["status"] == {"position": 2, "phase": "Enqueued"}
    assert "position" not in (c.unit_obj("ns", "pod-p-000").get("status") or {})
    c.set_pod_phase("ns", "p-000", "Succeeded")
    await c.settle()
    assert "position" not in c.unit_obj("ns", "pod-p-001")["status"]
    c.clock.advance(5)
    await publish(c)
    assert c.unit_obj("ns", "pod-p-002")["status"]["position"] == 1


def status_writes(c: Cluster, fragment: str) -> int:
    return sum(1 for m, p in c.api.calls if m == "PATCH" and p.endswith("/status")
               and fragment in p)


async def test_status_is_only_written_when_changed_and_not_too_often() -> None:
    c = Cluster(LoopSettings(debounce=0.0, status_interval=10.0))
    await c.nodes(2)
    await c.queue("q")
    await c.pods("ns", "q", 1)
    await c.settle()
    await publish(c)
    assert status_writes(c, "/queues/q/") == 1
    await publish(c)  # nothing changed
    assert status_writes(c, "/queues/q/") == 1
    await c.pods("ns", "q", 3, prefix="more")
    await c.settle()
    c.clock.advance(3)
    await publish(c)  # changed, but the last write is only 3 s old
    assert status_writes(c, "/queues/q/") == 1
    c.clock.advance(8)
    await publish(c)
    assert status_writes(c, "/queues/q/") == 2
    assert c.queue_status("q")["admitted"] == 2


async def test_queue_status_does_not_wait_behind_unit_writes() -> None:
    # Every slot for unit writes is taken (a backlog of admissions and
    # releases under a slow apiserver): the Queue's status still goes out.
    c = Cluster(LoopSettings(debounce=0.0, max_writes=1))
    await c.nodes(2)
    await c.queue("q")
    await c.pods("ns", "q", 1)
    await c.settle()
    stuck = asyncio.Event()

    async def unit_write() -> None:
        await stuck.wait()

    c.controller.writes.spawn(unit_write, key="ns/stuck")
    c.controller.writes.spawn(unit_write, key="ns/behind")
    await asyncio.sleep(0)
    assert status_writes(c, "/queues/q/") == 0
    await c.controller.publisher.publish()
    for _ in range(50):
        await asyncio.sleep(0)
    assert status_writes(c, "/queues/q/") == 1
    assert c.queue_status("q")["admitted"] == 1
    stuck.set()
    await c.controller.writes.wait()


async def test_all_status_writes_together_stay_under_the_rate() -> None:
    c = Cluster(LoopSettings(debounce=0.0, status_qps=2.0))
    await c.nodes(1)
    await c.queue("q")
    await c.pods("ns", "q", 30)
    await c.settle()
    admission = status_writes(c, "/")
    await publish(c)  # burst: 2 × qps
    first_round = status_writes(c, "/")
    assert first_round == admission + 4
    c.clock.advance(1.0)
    await publish(c)
    assert status_writes(c, "/") == first_round + 2


async def test_a_unit_with_no_position_yet_is_written_before_shifts() -> None:
    """Every admission shifts the positions of all behind it; under the
    write budget those shifts must not starve a unit's first status."""
    c = Cluster(LoopSettings(debounce=0.0, status_qps=2.0))
    await c.nodes(1)
    await c.queue("q")
    await c.pods("ns", "q", 12)
    await c.settle()
    for _ in range(3):  # a few rounds: more positions shown than one round's budget
        await publish(c)
        c.clock.advance(1.0)
    unwritten = [f"pod-p-{i:03d}" for i in range(1, 12)
                 if "position" not in (c.unit_obj("ns", f"pod-p-{i:03d}").get("status") or {})]
    assert unwritten and len(unwritten) < 10  # some shown, not all: the budget
    c.set_pod_phase("ns", "p-000", "Succeeded")  # the rest move up one
    await c.settle()
    c.clock.advance(5)
    await publish(c)
    assert "position" in (c.unit_obj("ns", unwritten[0]).get("status") or {})


async def test_closed_queue_says_so_in_its_condition() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q", state="Closed")
    await c.pods("ns", "q", 1)
    await c.settle()
    await publish(c)
    condition: dict[str, Any] = c.queue_status("q")["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("False", "Closed")
    assert c.queue_status("q")["pending"] == 1


async def test_admission_metrics_count_and_time_admissions() -> None:
    c = Cluster()
    await c.nodes(3)
    await c.queue("metered")
    before = sample("arbiter_admitted_units_total", queue="metered") or 0.0
    await c.pods("ns", "metered", 3)
    c.clock.advance(7)
    await c.settle()
    assert sample("arbiter_admitted_units_total", queue="metered") == before + 3
    assert sample("arbiter_admission_wait_seconds_count", queue="metered") == 3
    assert sample("arbiter_admission_wait_seconds_sum", queue="metered") == 21.0


async def test_gauges_of_a_deleted_queue_are_removed() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("gone")
    await c.pods("ns", "gone", 1)
    await c.settle()
    await publish(c)
    assert sample("arbiter_queue_allocated", queue="gone", resource="cpu") == 1.0
    await c.api.delete("/apis/arbiter.dev/v1alpha1/queues/gone")
    await c.settle()
    await publish(c)
    assert sample("arbiter_queue_allocated", queue="gone", resource="cpu") is None
    assert sample("arbiter_queue_dominant_share", queue="gone") is None


def test_summary_is_sorted_and_canonical() -> None:
    resources = Resources({"memory": 12 * 2**30, "cpu": 3000, "nvidia.com/gpu": 2})
    assert summary(resources) == "cpu=3,memory=12Gi,nvidia.com/gpu=2"
    assert summary(Resources({"cpu": 1500})) == "cpu=1500m"
    assert summary(EMPTY) == ""


async def test_status_carries_one_line_summaries_for_kubectl() -> None:
    c = Cluster()
    await c.nodes(2)
    await c.queue("q")
    await c.pods("ns", "q", 3)
    await c.settle()
    await publish(c)
    status = c.queue_status("q")
    assert (status["allocatedSummary"], status["deservedSummary"]) == ("cpu=2", "cpu=2")


async def test_a_queue_that_empties_shows_nothing_allocated() -> None:
    # A merge patch of `allocated: {}` leaves the old keys in place; the
    # status must say the queue holds nothing once its work is gone.
    c = Cluster(LoopSettings(debounce=0.0, status_interval=1.0))
    await c.nodes(2)
    await c.queue("q")
    await c.pods("ns", "q", 2)
    await c.settle()
    await publish(c)
    assert c.queue_status("q")["allocated"] == {"cpu": "2"}
    for name in ("p-000", "p-001"):
        c.set_pod_phase("ns", name, "Succeeded")
    await c.settle()
    c.clock.advance(2)
    await publish(c)
    status = c.queue_status("q")
    assert status["allocated"] == {} and status["deserved"] == {}
    assert "allocatedSummary" not in status and "deservedSummary" not in status
    assert (status["admitted"], status["pending"]) == (0, 0)


async def test_status_write_conflict_rereads_and_retries() -> None:
    c = Cluster(LoopSettings(debounce=0.0, status_interval=1.0))
    await c.nodes(1)
    await c.queue("q")
    await c.pods("ns", "q", 1)
    await c.settle()
    # Someone else wrote the Queue after the cache saw it: stale resourceVersion.
    await c.api.merge_patch("/apis/arbiter.dev/v1alpha1/queues/q",
                            {"metadata": {"annotations": {"x": "y"}}})
    record = c.store.queues["q"]
    stale = dataclasses.replace(record, resource_version="1")
    view = c.controller.publisher.queue_writer
    views = queue_views(c.controller.mirror)
    assert await view.write(views["q"], stale, c.clock()) is True
    assert c.queue_status("q")["allocated"] == {"cpu": "1"}
    assert [m for m, p in c.api.calls if p == "/apis/arbiter.dev/v1alpha1/queues/q"] == [
        "PATCH", "GET"]


def test_queue_printer_columns_name_scalar_status_fields() -> None:
    crd = yaml.safe_load((Path(__file__).resolve().parents[2]
                          / "manifests" / "crds" / "queue.yaml").read_text())
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Allocated"] == ".status.allocatedSummary"
    assert columns["Deserved"] == ".status.deservedSummary"
    for name, path in columns.items():
        if path.startswith(".metadata."):
            continue  # ObjectMeta: not in the CRD's schema
        node = schema
        for part in path.strip(".").split("."):
            node = node["properties"][part]
        assert node["type"] != "object", f"{name}: {path} would print as map[...]"


async def test_a_parent_queue_shows_its_subtree_totals() -> None:
    """DESIGN §11: a parent's status carries `subtree` allocated/deserved."""
    c = Cluster()
    await c.nodes(10)
    await c.queue("org")
    await c.queue("ta", parent="org")
    await c.queue("tb", parent="org", weight=3)
    await c.queue("solo")
    await c.pods("na", "ta", 4, prefix="a")
    await c.pods("nb", "tb", 4, prefix="b")
    await c.pods("ns", "solo", 10, prefix="s")
    await c.settle()
    await publish(c)
    org = c.queue_status("org")
    held = sum(int(c.queue_status(q)["allocated"].get("cpu", "0")) for q in ("ta", "tb"))
    assert org["subtree"]["allocated"] == {"cpu": str(held)}
    # The top level shares 10 CPUs: org's subtree (demand 8) and solo get 5 each.
    assert org["subtree"]["deserved"] == {"cpu": "5"}
    assert "subtree" not in c.queue_status("ta") and "subtree" not in c.queue_status("solo")
    # Metrics carry each queue's parent; a re-parented queue's old series goes.
    assert sample("arbiter_queue_info", queue="ta", parent="org") == 1.0
    assert sample("arbiter_queue_info", queue="org", parent="") == 1.0
    await c.set_queue("ta", parent="solo")
    await c.settle()
    await publish(c)
    assert sample("arbiter_queue_info", queue="ta", parent="org") is None
    assert sample("arbiter_queue_info", queue="ta", parent="solo") == 1.0
