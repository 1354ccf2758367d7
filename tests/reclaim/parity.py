"""Loop against engine: a cluster played through the real admission loop
(in-memory apiserver, fake clock, `KubeSim` for the Job controller and the
scheduler) and the same state settled offline by `arbiter.core.reclaim.sim`,
the engine `arbiter fairshare --from` runs (issue 26).

`Case` describes nodes (with zones), pools, queues (weights, guarantees,
capabilities, parents, pools) and Jobs (cpu per pod, parallelism) in their
arrival order. `play` lets them arrive one a second (well inside the
grace: nothing is reclaimed yet), takes the loop's state then (what runs,
where, and what waits: the `--from` input), lets every grace pass (the
clock jumps, and from then on the grace is 0: every starving queue is due
at every look, as offline) and every eviction complete until nothing
moves, and returns both allocations."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from arbiter.core.model import Node, Pool
from arbiter.core.reclaim.sim import Simulation
from arbiter.loop.mirror import queue_spec
from arbiter.loop.reclaim import reclaim_queues
from tests.loop.test_placement import POOLS
from tests.reclaim.kubesim import KubeSim
from tests.reclaim.test_loop import GRACE, ReclaimCluster


@dataclass(frozen=True)
class Job:
    queue: str
    cpu: str = "1"
    parallelism: int = 1


@dataclass(frozen=True)
class Case:
    nodes: tuple[tuple[str, str], ...]  # (cpu, zone) each
    queues: dict[str, dict[str, Any]]  # name -> Queue spec
    jobs: tuple[Job, ...]  # in arrival order
    pools: dict[str, str] = field(default_factory=dict)  # pool -> zone


@dataclass
class Outcome:
    loop: dict[str, int]
    engine: dict[str, int]
    rounds: int
    moves: int  # victims the engine took
    evicted: int  # victims the loop took
    loop_units: list[str] = field(default_factory=list)  # admitted at the end
    engine_units: list[str] = field(default_factory=list)
    engine_moves: list[str] = field(default_factory=list)


def settled(c: ReclaimCluster) -> tuple[object, ...]:
    engine = c.controller.mirror.engine
    return (tuple(sorted(k for k, (s, _) in c.controller.mirror.entries.items()
                         if s == "admitted")),
            tuple(sorted(c.controller.writes.evictions.taking())),
            tuple(sorted(c.controller.writes.evictions.draining())),
            len(engine.free()))


async def build(case: Case) -> tuple[ReclaimCluster, KubeSim]:
    c = ReclaimCluster()
    sim = KubeSim(c)
    for index, (cpu, zone) in enumerate(case.nodes):
        await c.api.create("/api/v1/nodes", {
            "metadata": {"name": f"n{index}", "labels": {"zone": zone}},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}})
    for name, zone in case.pools.items():
        await c.api.create(POOLS, {"metadata": {"name": name},
                                   "spec": {"nodeSelector": {"zone": zone}}})
    # Parents before children (a child names an existing parent, as the webhook asks).
    for name, spec in case.queues.items():
        await c.queue(name, **spec)
    await c.settle()
    return c, sim


def counts(c: ReclaimCluster, names: list[str]) -> dict[str, int]:
    engine = c.controller.mirror.engine
    return {name: engine.admitted_count(name) for name in names}


async def play(case: Case, max_rounds: int = 60,
               loop_only: AbstractContextManager[object] | None = None) -> Outcome:
    return (await run(case, max_rounds, loop_only))[0]


async def run(case: Case, max_rounds: int = 60,
              loop_only: AbstractContextManager[object] | None = None, *,
              missed: bool = False) -> tuple[Outcome, ReclaimCluster, Simulation]:
    """`loop_only`: a context the loop's part runs in (not the engine's);
    `missed`: the Job controller misses every suspension (`KubeSim.missed`)."""
    with loop_only or nullcontext():
        c, simulation, rounds = await _loop(case, max_rounds, missed)
    names = list(case.queues)
    simulation.settle()
    return Outcome(
        counts(c, names), simulation.counts(), rounds, len(simulation.moves),
        sum(1 for s in c.events.said if s.reason in ("ReclaimedByQueue", "PreemptedByArbiter")),
        sorted(k for k, (s, _) in c.controller.mirror.entries.items() if s == "admitted"),
        sorted(u.key for name in names for u in simulation.engine.admitted(name)),
        [f"{m.round}: {m.taker} {m.for_unit} <- {m.unit}" for m in simulation.moves]), c, simulation


async def _loop(case: Case, max_rounds: int,
                missed: bool = False) -> tuple[ReclaimCluster, Simulation, int]:
    c, kube = await build(case)
    kube.missed = missed
    for index, job in enumerate(case.jobs):
        await c.job(f"ns-{job.queue}", f"j{index:03d}", job.queue, cpu=job.cpu,
                    parallelism=job.parallelism)
        await c.settle()
        await kube.step()
        await c.settle()
        c.clock.advance(1.0)
    assert len(case.jobs) < GRACE  # nothing was due while they arrived
    engine = offline(c)
    # Every grace passes at once: from now on every starving queue is due,
    # as offline (else a queue whose clock started a look later waits while
    # another takes first, and mixed shapes end elsewhere).
    reclaimer = c.controller.reclaimer
    reclaimer.settings = replace(reclaimer.settings, grace=0.0)
    before = None
    rounds = 0
    quiet = 0
    while quiet < 3:
        rounds += 1
        assert rounds <= max_rounds, "the loop never settled"
        await c.look(GRACE + 1)
        await kube.step()
        await c.settle()
        await kube.finish()
        await c.settle()
        await kube.step()
        await c.settle()
        now = settled(c)
        quiet = quiet + 1 if now == before else 0
        before = now
    return c, engine, rounds


def offline(c: ReclaimCluster) -> Simulation:
    """The loop's state now as the offline engine's input (`--from`): its
    queues, nodes and pools; its admitted units where they run, in the
    order it admitted them; its waiting units as they wait."""
    mirror = c.controller.mirror
    store = c.store
    nodes = [Node(record.name, dict(record.labels), record.allocatable)
             for record in store.nodes.values()]
    pools = [Pool(record.name, dict(record.node_selector)) for record in store.pools.values()]
    specs = [queue_spec(record) for record in mirror.queues.values()]
    simulation = Simulation(mirror.engine.capacity(), specs, reclaim_queues(mirror),
                            nodes=nodes or None, pools=pools)
    units = c.store.units
    admitted = sorted(((units[key].last_allocate_time or "", unit.created, key, unit)
                       for key, (state, unit) in mirror.entries.items() if state == "admitted"),
                      key=lambda item: item[:3])
    for _, _, key, unit in admitted:
        simulation.run(unit, mirror.plan(key))
    for _key, (state, unit) in sorted(mirror.entries.items(), key=lambda i: i[1][1].created):
        if state == "pending":
            simulation.submit(unit)
    return simulation
