"""Reclaim in the admission loop (arbiter.loop.reclaim + evict) on the
in-memory apiserver: grace, Job requeue, pod eviction (PDB 429 retried,
never forced), in-flight tracking, within-queue preemption, visibility."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from arbiter.base import metrics
from arbiter.base.kubeapi import ApiError, Conflict, Obj, pod_path
from arbiter.loop.reclaim import WAKE_KEY
from arbiter.loop.settings import LoopSettings
from arbiter.testing.memory import InMemoryApi
from tests.loop.harness import T0, Cluster

GRACE = 30.0


class EvictingApi(InMemoryApi):
    """InMemoryApi plus the pod `eviction` subresource: a PodDisruptionBudget
    is played by `blocked` (429), graceful termination by `graceful` (the
    pod stays, terminating, until `finish_terminating`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blocked: set[str] = set()
        self.graceful = False
        self.evicted: list[str] = []
        self.terminating: list[str] = []

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj:
        if not path.endswith("/eviction"):
            return await super().create(path, body)
        self._check("POST", path, body)
        target = path[: -len("/eviction")]
        pod = self._get(target)
        name = pod["metadata"]["name"]
        uid = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        if uid and uid != pod["metadata"]["uid"]:
            raise Conflict(409, "Conflict", "uid precondition failed")
        if name in self.blocked:
            raise ApiError(429, "TooManyRequests",
                           "Cannot evict pod as it would violate the pod's disruption budget.")
        self.evicted.append(name)
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or []
                      if c.get("type") != "DisruptionTarget"]
        conditions.append({"type": "DisruptionTarget", "status": "True",
                           "reason": "EvictionByEvictionAPI"})
        if self.graceful:
            def terminate(obj: Obj) -> None:
                obj["metadata"]["deletionTimestamp"] = "2023-11-14T22:13:20Z"
                obj.setdefault("status", {})["conditions"] = conditions
            self.edit(target, terminate)
            self.terminating.append(target)
        else:
            await self.delete(target)
        return {"kind": "Status", "status": "Success"}

    async def finish_terminating(self) -> None:
        for target in self.terminating:
            if target in self.objects:
                await self.delete(target)
        self.terminating.clear()


class ReclaimCluster(Cluster):
    def __init__(self, grace: float = GRACE) -> None:
        super().__init__(LoopSettings(debounce=0.0, reclaim_grace=grace))
        self.controller.stop_listening()
        self.api = EvictingApi(self.store, clock=self.clock)
        self.controller = self.new_controller()

    @property
    def evicting(self) -> EvictingApi:
        assert isinstance(self.api, EvictingApi)
        return self.api

    async def look(self, seconds: float = 1.0) -> None:
        """Let time pass (one reclaim interval by default) and settle."""
        self.clock.advance(seconds)
        await self.settle()

    def pods_of(self, namespace: str) -> list[str]:
        return sorted(o["metadata"]["name"] for o in self.api.of_kind("pods")
                      if o["metadata"]["namespace"] == namespace)

    def running_pods(self, namespace: str) -> None:
        for name in self.released_pods(namespace):
            self.set_pod_phase(namespace, name, "Running")


def preempted(queue: str, reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "arbiter_preempted_units_total", {"queue": queue, "reason": reason})
    return value or 0.0


async def tenants(c: ReclaimCluster, *, reclaimable: bool = True, **a: Any) -> None:
    await c.nodes(10)
    await c.queue("a", reclaimable=reclaimable, **a)
    await c.queue("b")


async def pods_fill_then_arrive(c: ReclaimCluster, *, starving: bool = True,
                                count: int = 10) -> None:
    await c.pods("na", "a", count)
    await c.settle()
    c.running_pods("na")
    await c.settle()
    assert len(c.released_pods("na")) == count
    await c.pods("nb", "b", count)
    await c.settle()  # b's units are created
    await c.look()  # the next look: b starts to starve
    assert c.released_pods("nb") == []
    assert c.controller.reclaimer.since == ({"b": c.clock()} if starving else {})


async def test_pods_are_evicted_after_the_grace_and_shares_converge() -> None:
    c = ReclaimCluster()
    await tenants(c)
    before = preempted("a", "reclaim")
    await pods_fill_then_arrive(c)
    await c.look(GRACE - 2)
    assert c.evicting.evicted == []  # short bursts are absorbed
    await c.look(3)
    assert len(c.evicting.evicted) == 5
    assert set(c.evicting.evicted) <= {f"p-{i:03d}" for i in range(10)}
    await c.look()
    assert len(c.pods_of("na")) == 5 and len(c.released_pods("nb")) == 5
    assert preempted("a", "reclaim") - before == 5
    # Stable: nothing more is taken, however long b's other five wait.
    c.running_pods("nb")
    for _ in range(5):
        await c.look(GRACE)
    assert len(c.evicting.evicted) == 5 and len(c.released_pods("nb")) == 5
    reasons = {(s.reason, s.unit.split("/")[0]) for s in c.events.said}
    assert ("ReclaimedByQueue", "na") in reasons and ("Reclaiming", "nb") in reasons
    said = next(s for s in c.events.said if s.reason == "ReclaimedByQueue")
    assert said.type == "Warning" and "reclaimed by queue b" in said.message


async def test_looks_out_of_time_take_the_same_back_over_more_looks() -> None:
    # A look stops once its time budget is spent (here at once, after one
    # unit each): the next looks go on, and the shares end where one whole
    # look would have put them.
    c = ReclaimCluster()
    reclaimer = c.controller.reclaimer
    reclaimer.settings = dataclasses.replace(reclaimer.settings, budget=0.0)
    await tenants(c)
    await pods_fill_then_arrive(c)
    await c.look(GRACE + 1)
    assert 1 <= len(c.evicting.evicted) < 5
    for _ in range(10):
        await c.look()
    assert len(c.evicting.evicted) == 5
    assert len(c.pods_of("na")) == 5 and len(c.released_pods("nb")) == 5


async def test_an_evicted_pods_unit_says_why_and_the_pod_is_marked() -> None:
    c = ReclaimCluster()
    c.evicting.graceful = True
    await tenants(c)
    await pods_fill_then_arrive(c)
    await c.look(GRACE + 1)
    assert len(c.evicting.evicted) == 5
    name = c.evicting.evicted[0]
    status = c.unit_obj("na", f"pod-{name}")["status"]
    assert status["phase"] == "Failed"
    assert status["message"].startswith("reclaimed by queue b for unit nb/pod-p-")
    assert status["message"].endswith("evicted")
    pod = c.api.objects[pod_path("na", name)]
    condition = next(x for x in pod["status"]["conditions"] if x["type"] == "DisruptionTarget")
    assert condition["reason"] == "ReclaimedByQueue" and "queue b" in condition["message"]
    # The engine let the capacity go at once; b's pods are released and
    # wait for the terminating ones (as kube-scheduler's nominated pods do).
    await c.look()
    assert len(c.released_pods("nb")) == 5
    await c.evicting.finish_terminating()
    await c.look()
    assert len(c.pods_of("na")) == 5 and len(c.evicting.evicted) == 5


async def a_runs_ten_jobs(c: ReclaimCluster) -> None:
    """Queue a holds the whole cluster: ten Jobs admitted and running."""
    await tenants(c)
    for index in range(10):
        await c.job("na", f"a{index}", "a", created=T0 + index)
    await c.settle()
    for index in range(10):
        c.run_job("na", f"a{index}")
    await c.settle()


async def test_a_job_seen_waiting_on_a_stale_version_is_not_taken_back() -> None:
    """A version the watch brought back from before an admission (chaos run
    16: an assumption expired while the watch could not resume) shows a
    released Job's unit Enqueued: counted admitted all the same, it may be
    chosen. The requeue's guarded write finds the unit admitted: the Job is
    left alone, and taken back (or not) on the current version."""
    c = ReclaimCluster(grace=0.0)
    await a_runs_ten_jobs(c)
    current = {n: copy.deepcopy(c.unit_obj("na", f"job-a{n}")) for n in range(10)}
    for obj in current.values():
        stale = copy.deepcopy(obj)
        stale["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) - 1)
        stale["status"] = {"phase": "Enqueued", "message": "waiting"}
        c.store.apply("QueueUnit", "MODIFIED", stale)
    for index in range(10):
        await c.job("nb", f"b{index}", "b", created=T0 + 100 + index)
    for _ in range(3):  # b's units come, b starves, victims are chosen
        await c.look()
    assert not [n for n in range(10) if c.suspended("na", f"a{n}")]
    assert all(c.phase("na", f"job-a{n}") == "Running" for n in range(10))
    for obj in current.values():  # the watch catches up
        c.store.apply("QueueUnit", "MODIFIED", obj)
    await c.look()
    await c.look()
    assert len([n for n in range(10) if c.suspended("na", f"a{n}")]) == 5


async def test_jobs_are_suspended_and_requeued_in_place() -> None:
    c = ReclaimCluster()
    await a_runs_ten_jobs(c)
    for index in range(10):
        await c.job("nb", f"b{index}", "b", created=T0 + 100 + index)
    await c.settle()
    await c.look()
    await c.look(GRACE)
    suspended = [f"a{i}" for i in range(10) if c.suspended("na", f"a{i}")]
    assert len(suspended) == 5
    for name in suspended:
        status = c.unit_obj("na", f"job-{name}")["status"]
        assert status["phase"] == "Enqueued"
        assert "reclaimed by queue b" in status["message"] and status["message"].endswith(
            "requeued")
        assert status["attempts"] == 1 and len(status["admissions"]) == 1
        assert "allocated" not in status
    await c.look()
    running_b = [f"b{i}" for i in range(10) if not c.suspended("nb", f"b{i}")]
    assert running_b == [f"b{i}" for i in range(5)]
    # b's first five finish: their room goes to b's next five (b is lowest).
    for name in running_b:
        c.run_job("nb", name)
        c.finish_job("nb", name)
    await c.look()
    assert [f"b{i}" for i in range(10) if not c.suspended("nb", f"b{i}")] == [
        f"b{i}" for i in range(10)]
    # Then b is done and a's requeued Jobs come back, none lost.
    for index in range(5, 10):
        c.run_job("nb", f"b{index}")
        c.finish_job("nb", f"b{index}")
    await c.look()
    assert all(not c.suspended("na", f"a{i}") for i in range(10))
    for name in suspended:
        status = c.unit_obj("na", f"job-{name}")["status"]
        assert status["phase"] in ("Dequeued", "Running") and len(status["admissions"]) == 2


async def test_a_non_reclaimable_queue_keeps_everything() -> None:
    c = ReclaimCluster()
    await tenants(c, reclaimable=False)
    # b is not starving: no queue may lose anything, so no grace runs for it.
    await pods_fill_then_arrive(c, starving=False)
    for _ in range(4):
        await c.look(GRACE)
    assert c.evicting.evicted == [] and c.released_pods("nb") == []
    assert c.controller.reclaimer.since == {}


async def test_a_blocked_eviction_is_retried_later_never_forced() -> None:
    c = ReclaimCluster()
    await tenants(c, capability={"cpu": "10"})
    c.evicting.blocked = {f"p-{i:03d}" for i in range(10)}
    await pods_fill_then_arrive(c)
    await c.look(GRACE + 1)
    assert c.evicting.evicted == [] and len(c.pods_of("na")) == 10
    posts = [p for m, p in c.api.calls if m == "POST" and p.endswith("/eviction")]
    assert len(posts) == 5
    blocked = [s for s in c.events.said if s.reason == "EvictionBlocked"]
    assert len(blocked) == 5 and "PodDisruptionBudget" in blocked[0].message
    # Within the backoff the same pods are left alone, and no others are
    # tried in their place more than once each.
    await c.look()
    second = [p for m, p in c.api.calls if m == "POST" and p.endswith("/eviction")]
    assert len(second) == 10
    await c.look()
    assert len([p for m, p in c.api.calls if m == "POST" and p.endswith("/eviction")]) == 10
    c.evicting.blocked = set()
    await c.look(10)
    assert len(c.evicting.evicted) == 5
    assert len(c.pods_of("na")) == 5


async def test_a_victim_is_never_taken_twice_for_one_shortfall() -> None:
    c = ReclaimCluster()
    await tenants(c)
    await pods_fill_then_arrive(c)
    c.evicting.graceful = True
    # The evictions are accepted, but the watch does not deliver anything
    # any more: the loop must not pick more victims for the same waiting units.
    c.api.lag = True
    await c.look(GRACE + 1)
    first = list(c.evicting.evicted)
    assert len(first) == 5
    for _ in range(3):
        await c.look()
    assert c.evicting.evicted == first
    c.api.lag = False
    c.api.deliver()
    await c.evicting.finish_terminating()
    await c.look()
    assert c.evicting.evicted == first and len(c.released_pods("nb")) == 5


async def test_in_flight_victims_count_as_freed() -> None:
    c = ReclaimCluster()
    await tenants(c)
    await pods_fill_then_arrive(c)
    reclaimer = c.controller.reclaimer
    mirror = c.controller.mirror
    reclaimer.since["b"] = c.clock() - GRACE
    first = reclaimer.look(mirror, c.clock() + 1)
    assert len(first.victims) == 5 and set(reclaimer.evictions.taking()) == {
        v.unit.key for v in first.victims}
    again = reclaimer.look(mirror, c.clock() + 2)
    assert again.looked and again.victims == []
    assert again.plan.served[:5] == first.plan.served[:5]


async def test_the_loop_wakes_itself_when_the_grace_runs_out() -> None:
    c = ReclaimCluster()
    await tenants(c)
    await pods_fill_then_arrive(c)
    await c.look()
    since = c.controller.reclaimer.since["b"]
    assert c.controller.writes.timer_for(WAKE_KEY) == since + GRACE


async def test_within_queue_lower_priority_displaces_a_lower_priority_pod() -> None:
    c = ReclaimCluster()
    await c.nodes(10)
    await c.queue("w", capability={"cpu": "3"}, preemption={"withinQueue": "LowerPriority"})
    before = preempted("w", "withinQueue")
    await c.pods("nw", "w", 3, prefix="low")
    await c.settle()
    c.running_pods("nw")
    c.clock.advance(5)
    await c.pod("nw", "high", "w", priority=100)
    await c.pod("nw", "same", "w", priority=0)
    await c.settle()
    await c.look()
    assert len(c.evicting.evicted) == 1  # immediately: no grace inside a queue
    await c.look()
    assert "high" in c.released_pods("nw") and "same" not in c.released_pods("nw")
    assert preempted("w", "withinQueue") - before == 1
    said = next(s for s in c.events.said if s.reason == "PreemptedByArbiter")
    assert "higher-priority unit nw/pod-high" in said.message
    for _ in range(3):
        await c.look(GRACE)
    assert len(c.evicting.evicted) == 1  # equal priority never displaces


async def test_within_queue_never_is_the_default() -> None:
    c = ReclaimCluster()
    await c.nodes(10)
    await c.queue("w", capability={"cpu": "3"})
    await c.pods("nw", "w", 3, prefix="low")
    await c.settle()
    c.running_pods("nw")
    await c.pod("nw", "high", "w", priority=100)
    for _ in range(3):
        await c.look(GRACE)
    assert c.evicting.evicted == [] and "high" not in c.released_pods("nw")


async def test_reservations_are_requeued() -> None:
    c = ReclaimCluster()
    await tenants(c)
    for index in range(10):
        await c.api.create("/apis/arbiter.dev/v1alpha1/namespaces/na/queueunits", {
            "metadata": {"name": f"hold-{index}", "namespace": "na"},
            "spec": {"queue": "a", "podSets": [{"name": "main", "count": 1,
                                                "requests": {"cpu": "1"}}]}})
    await c.settle()
    await c.pods("nb", "b", 3)
    await c.settle()
    await c.look()
    await c.look(GRACE)
    phases = [c.phase("na", f"hold-{i}") for i in range(10)]
    assert phases.count("Enqueued") == 3 and phases.count("Dequeued") == 7
    await c.look()
    assert len(c.released_pods("nb")) == 3


async def test_a_pod_group_is_evicted_whole() -> None:
    c = ReclaimCluster()
    await tenants(c)
    for group in range(5):
        for member in range(2):
            await c.pod("na", f"g{group}-{member}", "a", group=f"g{group}", size=2)
    await c.settle()
    c.running_pods("na")
    await c.settle()
    assert len(c.released_pods("na")) == 10
    await c.pods("nb", "b", 4)
    await c.settle()
    await c.look()
    await c.look(GRACE)
    evicted = sorted(c.evicting.evicted)
    groups = {name.split("-")[0] for name in evicted}
    assert len(evicted) == 4 and len(groups) == 2  # two whole groups, no half group
    assert all(f"{g}-{m}" in evicted for g in groups for m in range(2))
    await c.look()
    assert len(c.released_pods("nb")) == 4


def planned_node(c: ReclaimCluster, key: str) -> str:
    plan = c.controller.mirror.plan(key)
    assert plan is not None
    return plan.nodes["main"][0]


def run_on(node: str, pod: dict[str, Any]) -> None:
    pod["spec"]["nodeName"] = node
    pod.setdefault("status", {})["phase"] = "Running"


async def test_the_grace_clock_survives_victims_still_terminating() -> None:
    """Victims' pods still terminate on their nodes: the room they free is
    the taker's already (its units are admitted there and their pods wait
    for the nodes: nobody else may take that room first), and the taker's
    grace clock survives: b is still owed a unit (one victim's eviction was
    blocked) and gets it at the next look, not one whole grace later."""
    c = ReclaimCluster()
    c.evicting.graceful = True
    await tenants(c)
    await c.pods("na", "a", 10)
    await c.settle()
    nodes = {}
    for name in c.released_pods("na"):  # each running on its planned node
        plan = c.controller.mirror.plan(f"na/pod-{name}")
        assert plan is not None
        nodes[name] = plan.nodes["main"][0]
        c.api.edit(pod_path("na", name), functools.partial(run_on, nodes[name]))
    await c.settle()
    await c.pods("nb", "b", 10)
    await c.settle()
    await c.look()
    reclaimer = c.controller.reclaimer
    assert "b" in reclaimer.since
    c.evicting.blocked = {"p-004"}  # a PodDisruptionBudget keeps one victim
    await c.look(GRACE)
    assert c.evicting.evicted == ["p-000", "p-001", "p-002", "p-003"]
    assert len(c.pods_of("na")) == 10  # their pods still terminate
    # b's units are admitted on those nodes at once; b is still owed a unit:
    # a's next newest goes at this look, not a grace later.
    await c.look()
    assert c.evicting.evicted == ["p-000", "p-001", "p-002", "p-003", "p-005"]
    planned = {planned_node(c, f"nb/pod-p-{i:03d}") for i in range(5)}
    assert planned == {nodes[f"p-{i:03d}"] for i in (0, 1, 2, 3, 5)}
    await c.evicting.finish_terminating()
    await c.look()
    assert len(c.released_pods("nb")) == 5 and len(c.pods_of("na")) == 5
