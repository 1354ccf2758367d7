"""The chaos harness's parts without a cluster: the invariant watcher fed
hand-made watch events (each invariant caught, and its near misses let
through), the fault proxy (cut, refuse, restore, fail over), the fault plan
and the quantity parser it judges with."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import time
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest

from arbiter.sandbox.chaos_proxy import ChaosProxy, ProxyProcess
from arbiter.sandbox.process import free_port
from bench.chaos import Options, fairshare_offline, scenario_now
from bench.chaos_figures import figures
from bench.chaos_http import quantity
from bench.chaos_watch import Judge
from bench.chaos_world import (
    Shape,
    arrivals,
    fault_plan,
    offline_scenario,
    queues,
    tenant_names,
    wave,
)


def node(name: str, cpu: str = "4") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "memory": "8Gi",
                                                                   "pods": "110"}}}


def queue(name: str, ns: str, cpu_cap: str | None = None, parent: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"namespaces": [ns]} if ns else {}
    if cpu_cap:
        spec["capability"] = {"cpu": cpu_cap}
    if parent:
        spec["parent"] = parent
    return {"metadata": {"name": name}, "spec": spec}


def pod(uid: str, ns: str, node_name: str, cpu: str, job: str = "j1",
        phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": uid, "namespace": ns, "ownerReferences": [
                {"kind": "Job", "uid": job, "controller": True}]},
            "spec": {"nodeName": node_name, "containers": [
                {"resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": phase}}


def unit(phase: str, admissions: int, *, message: str = "", cpu: str = "2") -> dict[str, Any]:
    return {"metadata": {"uid": "u1", "name": "job-a", "namespace": "ns1"},
            "spec": {"queue": "q1", "consumerRef": {"uid": "j1"},
                     "podSets": [{"name": "main", "count": 1, "requests": {"cpu": cpu}}]},
            "status": {"phase": phase, "message": message, "allocated": {"cpu": cpu},
                       "admissions": [{"by": f"leader-{i}"} for i in range(admissions)]}}


@pytest.fixture
def judge() -> Judge:
    judge = Judge()
    judge.on_node("ADDED", node("n1"), 0.0)
    judge.on_queue("ADDED", queue("org", "", "3"), 0.0)
    judge.on_queue("ADDED", queue("q1", "ns1", parent="org"), 0.0)
    judge.on_queue("ADDED", queue("q2", "ns2"), 0.0)
    return judge


def test_quantities_parse_exactly() -> None:
    assert quantity("500m") == Fraction(1, 2)
    assert quantity("1Gi") == 2**30
    assert quantity("1e3") == 1000
    assert quantity(2) == 2
    with pytest.raises(ValueError):
        quantity("1Qi")


def test_a_node_over_its_allocatable_is_caught_and_finished_pods_free_it(judge: Judge) -> None:
    judge.on_pod("ADDED", pod("p1", "ns2", "n1", "3"), 0.0)
    judge.on_pod("MODIFIED", pod("p1", "ns2", "n1", "3", phase="Succeeded"), 0.0)
    judge.on_pod("ADDED", pod("p2", "ns2", "n1", "3", job="j2"), 0.0)
    assert judge.v.over_capacity == []
    judge.on_pod("ADDED", pod("p3", "ns2", "n1", "2", job="j3"), 0.0)
    assert len(judge.v.over_capacity) == 1 and "n1" in judge.v.over_capacity[0]


def test_a_pod_deleted_while_the_watch_was_down_frees_its_node_at_the_relist(
        judge: Judge) -> None:
    """Run 12: the apiserver restarted, the pod watch listed again, and a
    pod deleted meanwhile (its DELETED never delivered) kept counting on
    its node: the next pod bound there was reported over allocatable."""
    judge.on_pod("ADDED", pod("p1", "ns2", "n1", "3"), 0.0)
    kept = pod("p2", "ns2", "n1", "1", job="j2")
    judge.on_pod("ADDED", kept, 0.0)
    judge.resync_pods([kept])  # p1 was deleted while the watch was down
    judge.on_pod("ADDED", kept, 0.0)
    judge.on_pod("ADDED", pod("p3", "ns2", "n1", "3", job="j3"), 0.0)
    assert judge.v.over_capacity == []
    assert set(judge.pods) == {"p2", "p3"}


def test_a_parent_over_its_capability_counts_its_childrens_pods(judge: Judge) -> None:
    judge.on_node("ADDED", node("n2", "8"), 0.0)
    judge.on_pod("ADDED", pod("p1", "ns1", "n2", "2"), 0.0)
    judge.on_pod("ADDED", pod("p2", "ns2", "n2", "2", job="j2"), 0.0)  # not org's
    assert judge.v.over_capability == []
    judge.on_pod("ADDED", pod("p3", "ns1", "n2", "2", job="j3"), 0.0)
    assert judge.v.over_capability and "queue org" in judge.v.over_capability[0]


def test_admitted_units_over_capability_count_only_when_it_lasts(judge: Judge) -> None:
    two = unit("Running", 1, cpu="2")
    judge.on_unit("ADDED", two, 0.0)
    other = unit("Dequeued", 1, cpu="2")
    other["metadata"]["uid"] = "u2"
    other["spec"]["consumerRef"]["uid"] = "j2"
    judge.on_unit("ADDED", other, 0.0)
    judge.sample(now=100.0)
    judge.sample(now=103.0)
    assert judge.v.over_capability == []  # a status write may trail
    judge.sample(now=106.0)
    assert len(judge.v.over_capability) == 1
    judge.sample(now=107.0)
    assert len(judge.v.over_capability) == 1  # one report per spell


def test_a_second_admission_needs_a_requeue_in_between(judge: Judge) -> None:
    judge.on_unit("ADDED", unit("Enqueued", 0), 0.0)
    judge.on_unit("MODIFIED", unit("Dequeued", 1), 1.0)
    judge.on_unit("MODIFIED", unit("Enqueued", 1, message="reclaimed"), 2.0)
    judge.on_unit("MODIFIED", unit("Dequeued", 2), 3.0)
    assert judge.v.double_admission == []
    judge.on_unit("MODIFIED", unit("Running", 3), 4.0)
    assert len(judge.v.double_admission) == 1
    assert [by for _, _, by in judge.admissions] == ["leader-0", "leader-1", "leader-2"]


def test_a_unit_created_admitted_counts_from_its_annotation_until_its_status_is_written(
        judge: Judge) -> None:
    """A fast-path unit's admission is on record in `arbiter.dev/admitted-status`
    from its creation; the later status write with the same admission is
    not a second one, and a later status is not overruled by it."""
    created = unit("Dequeued", 1)
    recorded = created.pop("status")
    created["metadata"]["annotations"] = {"arbiter.dev/admitted-status": json.dumps(recorded)}
    judge.on_unit("ADDED", created, 1.0)
    assert [t for t, _, _ in judge.admissions] == [1.0]
    assert judge.units["u1"].phase == "Dequeued" and judge.units["u1"].allocated
    written = {**created, "status": unit("Running", 1)["status"]}
    judge.on_unit("MODIFIED", written, 5.0)
    assert len(judge.admissions) == 1 and judge.v.double_admission == []
    assert judge.units["u1"].phase == "Running"
    # Requeued: its status (admissions kept, allocated gone) is what counts.
    requeued = {**created, "status": {"phase": "Enqueued", "admissions": [{"by": "leader-0"}]}}
    judge.on_unit("MODIFIED", requeued, 9.0)
    assert judge.units["u1"].phase == "Enqueued" and not judge.units["u1"].allocated


def test_after_a_relist_a_jump_is_unverifiable_not_a_violation(judge: Judge) -> None:
    judge.on_unit("ADDED", unit("Dequeued", 1), 0.0)
    judge.resync_units([])
    judge.on_unit("ADDED", unit("Dequeued", 2), 1.0)
    assert judge.v.double_admission == []
    assert judge.v.unverifiable_admissions == 1


def test_a_unit_first_seen_in_a_relist_has_no_history_to_judge(judge: Judge) -> None:
    """Chaos run 19: created, admitted, reclaimed and admitted again while
    the watch was down; the relist brought it with 2 admissions."""
    listed = unit("Dequeued", 2)
    judge.resync_units([listed])
    judge.on_unit("ADDED", listed, 1.0)
    assert judge.v.double_admission == []
    assert judge.v.unverifiable_admissions == 1
    judge.on_unit("MODIFIED", unit("Running", 3), 2.0)  # seen from now on: judged
    assert len(judge.v.double_admission) == 1


def test_a_job_with_more_pods_than_its_admissions_allow_ran_twice(judge: Judge) -> None:
    judge.on_job("ADDED", {"metadata": {"uid": "j1", "name": "a", "namespace": "ns1"},
                           "spec": {"parallelism": 1},
                           "status": {"conditions": [{"type": "Complete", "status": "True"}]}},
                 0.0)
    judge.on_unit("ADDED", unit("Succeed", 1), 0.0)
    judge.on_pod("ADDED", pod("p1", "ns1", "n1", "1", phase="Succeeded"), 0.0)
    judge.finish()
    assert judge.v.double_run == [] and judge.v.lost == []
    judge.on_pod("ADDED", pod("p2", "ns1", "n1", "1", phase="Succeeded"), 0.0)
    judge.finish()
    assert len(judge.v.double_run) == 1


def test_an_unfinished_job_is_lost_unless_running_or_waiting_with_a_reason(judge: Judge) -> None:
    job = {"metadata": {"uid": "j1", "name": "a", "namespace": "ns1"}, "spec": {}}
    judge.on_job("ADDED", job, 0.0)
    judge.finish()
    assert len(judge.v.lost) == 1  # no unit at all
    judge.v.lost.clear()
    judge.on_unit("ADDED", unit("Enqueued", 0, message="queue at capability"), 0.0)
    judge.finish()
    assert judge.v.lost == []
    judge.on_job("MODIFIED", {"metadata": {**job["metadata"], "resourceVersion": "42",
                                           "managedFields": [
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status",
         "fieldsV1": {"f:status": {"f:active": {}}}},
        {"manager": "kube-arbiter", "operation": "Update", "time": "2026-11-29T06:23:18Z",
         "fieldsV1": {"f:spec": {"f:suspend": {}}}}]},
                              "spec": {"suspend": True}, "status": {"active": 1}}, 0.0)
    judge.on_unit("MODIFIED", unit("Dequeued", 1), 0.0)  # admitted, never released
    judge.finish()
    assert len(judge.v.lost) == 1
    # The line says which view of the Job is current, and who suspended it last.
    assert judge.v.lost[0].endswith(
        "Job suspend True (written by kube-arbiter Update 2026-11-29T06:23:18Z), "
        "status.active 1, resourceVersion 42"), judge.v.lost[0]
    judge.v.lost.clear()
    judge.on_pod("ADDED", pod("p1", "ns1", "n1", "1"), 0.0)
    judge.finish()
    assert judge.v.lost == [] and judge.still_running == 1


def test_a_job_caught_between_two_writes_is_lost_only_if_it_stays_so(judge: Judge) -> None:
    """Held again by its admission timeout, its unit not yet TimeoutBackoff
    when the drain ends: judged once more later, it waits with a reason."""
    job = {"metadata": {"uid": "j1", "name": "a", "namespace": "ns1"},
           "spec": {"suspend": True}}
    judge.on_job("ADDED", job, 0.0)
    judge.on_unit("ADDED", unit("Dequeued", 1), 0.0)
    judge.finish()
    assert len(judge.v.lost) == 1
    judge.recheck_lost()
    assert len(judge.v.lost) == 1 and judge.settled_later == 0  # still so: lost
    judge.on_unit("MODIFIED", unit("TimeoutBackoff", 1, message="not running 300s"), 1.0)
    judge.recheck_lost()
    assert judge.v.lost == [] and judge.settled_later == 1


def test_the_fault_plan_is_seeded_and_puts_other_faults_between_kills() -> None:
    plan = fault_plan(7, first=10, gap=(40, 45), leader_kills=2, others=["apiserver-restart"])
    assert plan == fault_plan(7, first=10, gap=(40, 45), leader_kills=2,
                              others=["apiserver-restart"])
    assert [f.kind for f in plan] == ["leader-kill", "apiserver-restart", "leader-kill"]
    assert plan[0].at == 10 and 30 < plan[1].at < plan[2].at


def test_the_offline_scenario_keeps_parents_and_waiting_pod_sets() -> None:
    document = offline_scenario(
        {"cpu": "8"}, [queue("org", "", "3"), queue("q1", "ns1", parent="org")],
        {"q1": [{"count": 2, "requests": {"cpu": "1"}}, {"count": 0, "requests": {}}]})
    by_name = {q["name"]: q for q in document["queues"]}
    assert by_name["org"]["capability"] == {"cpu": "3"} and by_name["org"]["units"] == []
    assert by_name["q1"]["parent"] == "org"
    assert by_name["q1"]["units"] == [{"count": 1, "pods": 2, "requests": {"cpu": "1"}}]


@pytest.mark.parametrize("make", [ChaosProxy, ProxyProcess], ids=["in-loop", "own-process"])
async def test_the_proxy_cuts_refuses_restores_and_fails_over(make: Any) -> None:
    """The same controls in the harness's loop and in a process of its own
    (the run's proxies: the harness's loop decodes every watch event)."""
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # Nothing listens on the first upstream (a replica down): the next is used.
    proxy = make([("127.0.0.1", free_port()), ("127.0.0.1", port)])
    await proxy.start()
    pid = getattr(proxy, "pid", None)

    async def roundtrip() -> bytes:
        """The echo, or b"" when the connection was closed or reset."""
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(b"ping")
            await writer.drain()
            data = await reader.read(100)
            writer.close()
        except ConnectionError:
            return b""
        return data

    try:
        assert await roundtrip() == b"ping"  # through the second upstream
        held = await asyncio.open_connection("127.0.0.1", proxy.port)
        await asyncio.sleep(0.05)
        assert proxy.cut() >= 1
        assert await held[0].read(100) == b""  # the open connection was cut
        assert await roundtrip() == b""  # and a new one is refused
        proxy.restore()
        assert await roundtrip() == b"ping"
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()
    if pid is not None:  # stopped, by its pid
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_the_balancer_routes_only_to_upstreams_that_answer_ready() -> None:
    """A Service's endpoints are its ready pods: a replica whose port
    accepts but whose cache is still loading gets no webhook calls (one
    did, and waved through a Job a loaded replica then denied)."""
    def echo_as(name: bytes) -> Any:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(100)
            writer.write(name)
            await writer.drain()
            writer.close()
        return echo

    servers = [await asyncio.start_server(echo_as(n), "127.0.0.1", 0) for n in (b"a", b"b")]
    ports = [int(s.sockets[0].getsockname()[1]) for s in servers]
    ready = {ports[0]: False, ports[1]: True}

    async def probe(_host: str, port: int) -> bool:
        return ready[port]

    proxy = ChaosProxy([("127.0.0.1", p) for p in ports], ready=probe, probe_period=0.05)
    await proxy.start()

    async def answer() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"?")
        await writer.drain()
        data = await reader.read(100)
        writer.close()
        return data

    try:
        assert {await answer() for _ in range(6)} == {b"b"}  # a accepts, but is not ready
        ready[ports[0]] = True
        await asyncio.sleep(0.2)
        assert {await answer() for _ in range(6)} == {b"a", b"b"}  # turns, once both are
        ready[ports[0]] = ready[ports[1]] = False
        await asyncio.sleep(0.2)
        try:  # no endpoints: closed at once, unanswered (reset or plain EOF)
            refused = await answer()
        except ConnectionError:
            refused = b""
        assert refused == b"" and proxy.refused >= 1
    finally:
        await proxy.close()
        for server in servers:
            server.close()
            await server.wait_closed()


def test_the_pipeline_line_puts_each_unfinished_job_at_its_furthest_step(judge: Judge) -> None:
    def job(uid: str, suspend: bool = False) -> dict[str, Any]:
        return {"metadata": {"uid": uid, "name": uid, "namespace": "ns1"},
                "spec": {"suspend": suspend, "parallelism": 2}}

    for uid, suspend in (("held", True), ("empty", False), ("waits", False), ("bound", False),
                         ("runs", False)):
        judge.on_job("ADDED", job(uid, suspend), 0.0)
    judge.on_pod("ADDED", pod("p1", "ns1", "", "1", job="waits", phase="Pending"), 0.0)
    judge.on_pod("ADDED", pod("p2", "ns1", "n1", "1", job="bound", phase="Pending"), 0.0)
    judge.on_pod("ADDED", pod("p3", "ns1", "n1", "1", job="runs"), 0.0)
    judge.on_pod("ADDED", pod("p4", "ns1", "", "1", job="runs", phase="Pending"), 0.0)
    assert judge.pipeline() == ("Jobs held=1 no pod=1 unbound=1 bound=1 running=1"
                                " | pods gated=0 unbound=2 bound=1 running=1")


def test_the_offline_answer_is_computed_on_a_snapshot_taken_on_the_event_loop(
        judge: Judge) -> None:
    """`arbiter fairshare` runs in a thread while the judge's watches go on
    changing its dicts: it gets a scenario built before, never the judge
    (iterating the judge's units from the thread failed with "dictionary
    changed size during iteration")."""
    judge.on_unit("ADDED", unit("Enqueued", 0, cpu="1"), 0.0)
    scenario = scenario_now(judge)
    before = json.dumps(scenario, sort_keys=True)
    later = unit("Enqueued", 0, cpu="1")
    later["metadata"]["uid"] = "u9"
    judge.on_unit("ADDED", later, 1.0)
    assert json.dumps(scenario, sort_keys=True) == before
    deserved = fairshare_offline(scenario)
    assert set(deserved) == {"org", "q1", "q2"}
    assert deserved["q1"]["cpu"] == 1  # its one waiting unit's demand


def _deserved_cpu(shape: Shape, demand: dict[str, list[dict[str, Any]]]) -> dict[str, Fraction]:
    """Per queue, as the run compares it (`arbiter fairshare`, a parent's its subtree's)."""
    capacity = {"cpu": str(shape.nodes * shape.node_cpu),
                "memory": f"{shape.nodes * shape.node_memory_gi}Gi"}
    deserved = fairshare_offline(offline_scenario(capacity, queues(shape), demand))
    return {name: shares.get("cpu", Fraction(0)) for name, shares in deserved.items()}


def _demand_of(jobs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per tenant, each Job's pods as one pod set (as the judge sees its unit)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in jobs:
        tenant = obj["metadata"]["namespace"].removeprefix("chaos-")
        requests = obj["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
        out.setdefault(tenant, []).append({"count": obj["spec"]["parallelism"],
                                           "requests": dict(requests)})
    return out


@pytest.mark.parametrize("shape", [Options().shape(), Options(nodes=200, jobs=500).shape()],
                         ids=["default", "short"])
def test_the_final_wave_leaves_every_queue_short_of_its_demand(shape: Shape) -> None:
    """The wave asks every queue for more than it can deserve, so the
    deserved shares compared after it do not move as the run's own Jobs
    end: the same with the wave alone as with half the run's Jobs still
    waiting too (with the old wave, 1.5× the cluster, the weight-4 queues
    got their demand, and the run's Jobs changed it)."""
    wave_demand = _demand_of(wave(shape))
    alone = _deserved_cpu(shape, wave_demand)
    for tenant, pod_sets in wave_demand.items():
        asked = sum(int(ps["count"]) * quantity(ps["requests"]["cpu"]) for ps in pod_sets)
        assert alone[tenant] < asked * Fraction(9, 10), tenant
    regular = _demand_of([obj for _, obj in arrivals(shape, 32)[::2]])
    mixed = {t: wave_demand.get(t, []) + regular.get(t, []) for t in tenant_names()}
    assert _deserved_cpu(shape, mixed) == alone


def test_a_takeover_is_timed_on_the_apiservers_clock_as_well_as_by_arrival(
        judge: Judge) -> None:
    """Chaos run 16: after an apiserver restart the watcher's own watch could
    not resume for minutes; the new leader's first admission arrived 181 s
    after its Lease, though written 2 s after. Both are shown."""
    wall = time.time() - 600.0  # the takeover, ten minutes ago
    killed = wall - judge.wall_offset - 15.0
    stamp = dt.datetime.fromtimestamp(wall + 0.25, dt.UTC)
    judge.on_lease("MODIFIED", {"spec": {
        "holderIdentity": "arbiter-5", "acquireTime": stamp.isoformat()}},
        killed + 15.5)
    admitted = unit("Dequeued", 1)
    admitted["status"]["admissions"] = [{"by": "arbiter-5"}]
    whole = dt.datetime.fromtimestamp(int(wall) + 2, dt.UTC)
    admitted["metadata"]["managedFields"] = [
        {"manager": "kube-arbiter", "operation": "Update", "subresource": "status",
         "time": whole.strftime("%Y-%m-%dT%H:%M:%SZ")},
        {"manager": "kube-arbiter", "operation": "Update",  # a later spec write: not it
         "time": (whole + dt.timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")}]
    judge.on_unit("ADDED", admitted, killed + 196.5)  # seen three minutes late
    injector = SimpleNamespace(kills=[(killed, "arbiter-4")], done=[])
    fig = figures(judge, injector, {}, killed - 100.0, killed + 300.0,  # type: ignore[arg-type]
                  killed, {})
    assert fig.takeover_admit == [pytest.approx(181.0)]
    assert fig.takeover_written == [pytest.approx(int(wall) + 2 - (wall + 0.25), abs=1e-3)]
    assert 0.75 <= fig.takeover_written[0] < 1.75
    assert "written +" in fig.takeovers[0]


async def test_a_watch_lists_again_after_a_410_and_says_how_long_it_saw_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The judge's watch: a 410 mid-stream makes it list again; the relist is
    recorded with the time since the last event (what the relist may hide)."""
    from aiohttp import web

    from bench.chaos_http import Api

    lists: list[int] = []
    watches: list[str] = []
    stop = asyncio.Event()

    async def serve(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "1":
            lists.append(len(lists))
            items = [{"metadata": {"name": f"u{i}", "resourceVersion": str(i)}}
                     for i in range(len(lists))]
            return web.json_response({"metadata": {"resourceVersion": str(len(lists))},
                                      "items": items})
        watches.append(request.query["resourceVersion"])
        response = web.StreamResponse()
        await response.prepare(request)
        if len(watches) == 1:
            await response.write(json.dumps({"type": "MODIFIED", "object": {
                "metadata": {"name": "u0", "resourceVersion": "7"}}}).encode() + b"\n")
            await asyncio.sleep(0.3)
            await response.write(json.dumps({"type": "ERROR", "object": {
                "code": 410}}).encode() + b"\n")
            return response
        await stop.wait()  # the resumed watch stays open until the test ends
        return response

    app = web.Application()
    app.router.add_get("/things", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    seen: list[tuple[str, str]] = []
    resyncs: list[int] = []
    try:
        async with Api(f"http://127.0.0.1:{port}", None) as api:
            task = asyncio.ensure_future(api.watch(
                "/things", lambda kind, obj, _: seen.append((kind, obj["metadata"]["name"])),
                lambda items: resyncs.append(len(items)), stop))
            for _ in range(100):
                if len(watches) >= 2:
                    break
                await asyncio.sleep(0.05)
            stop.set()
            task.cancel()
    finally:
        await runner.cleanup()
    assert resyncs == [1, 2] and watches[:2] == ["1", "2"]
    assert seen == [("ADDED", "u0"), ("MODIFIED", "u0"), ("ADDED", "u0"), ("ADDED", "u1")]
    [(path, unseen)] = api.relists
    assert path == "/things" and 0.25 <= unseen < 5, api.relists
    assert "watch /things: listed again (410), 2 objects" in capsys.readouterr().out
