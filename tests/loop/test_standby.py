"""A warm standby (arbiter.loop.standby): a replica that does not lead keeps
the engine in step, and the controller it hands over to admits in its first
cycle exactly what a cold controller would have admitted."""

from __future__ import annotations

import asyncio

import pytest

from arbiter.loop import standby as standby_module
from arbiter.loop.controller import AdmissionController
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.standby import WarmStandby
from tests.loop.harness import Cluster, eventually


async def waiting_cluster() -> Cluster:
    c = Cluster()
    await c.queue("a", namespaces=["ns-a"], weight=2)
    await c.queue("b", namespaces=["ns-b"])
    for index in range(6):
        await c.job("ns-a", f"a-{index}", "a", created=1_700_000_000.0 + index)
        await c.job("ns-b", f"b-{index}", "b", created=1_700_000_000.5 + index)
    # Units exist (a leader made them), nothing admitted: there was no room.
    await c.settle()
    await c.controller.close()
    c.controller.stop_listening()
    await c.nodes(4)  # room, while no one leads
    return c


def admitted_keys(controller: AdmissionController) -> list[str]:
    return sorted(unit.key for unit in controller.cycle())


async def test_a_warm_controller_admits_in_its_first_cycle_what_a_cold_one_would() -> None:
    cold_cluster = await waiting_cluster()
    # What a cold new leader decides (once every unit is classified).
    cold = AdmissionController(cold_cluster.store, cold_cluster.api, cold_cluster.settings,
                               clock=cold_cluster.clock)
    cold.start_listening()
    await cold.resync(reindex=True)
    chosen_cold: list[str] = []
    for _ in range(50):
        chosen_cold = admitted_keys(cold)
        if chosen_cold:
            break
    await cold.close()
    cold.stop_listening()

    warm_cluster = await waiting_cluster()
    standby = WarmStandby(warm_cluster.store, warm_cluster.settings.overcommit)
    standby.start()
    await eventually(lambda: standby.follow.indexed and not standby.follow.pending())
    follow = await standby.take()
    assert follow is not None
    warm = AdmissionController(warm_cluster.store, warm_cluster.api, warm_cluster.settings,
                               clock=warm_cluster.clock, follow=follow)
    warm.start_listening()
    assert warm.warm
    warm.warming = False  # what `run` does for a warm start
    assert admitted_keys(warm) == chosen_cold
    assert len(chosen_cold) == 4
    await warm.close()


async def test_a_standby_follows_changes_after_it_has_indexed() -> None:
    c = await waiting_cluster()
    standby = WarmStandby(c.store, 1.0)
    standby.start()
    await eventually(lambda: standby.follow.indexed and not standby.follow.pending())
    assert len(standby.follow.mirror.waiting_by_queue().get("a", ())) == 6
    await c.job("ns-a", "a-late", "a")
    leader = c.new_controller()  # a leader elsewhere: makes the unit, admits 4
    await c.settle(leader)

    def waiting(mirror: EngineMirror) -> list[str]:
        return sorted(u.key for units in mirror.waiting_by_queue().values() for u in units)

    await eventually(lambda: waiting(standby.follow.mirror) == waiting(leader.mirror))
    assert len(waiting(leader.mirror)) == 13 - 4
    follow = await standby.take()
    assert follow is standby.follow
    await asyncio.sleep(0)
    assert standby._on_change not in c.store.listeners



async def test_a_standby_taken_before_its_first_pass_ends_hands_over_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Taken while it still queues units for its engine (slices of one, the
    # event loop free between them): its engine lacks units, so the new
    # leader must start cold (classify everything), not admit at once.
    monkeypatch.setattr(standby_module, "SLICE", 1)
    c = await waiting_cluster()
    standby = WarmStandby(c.store, 1.0)
    standby.start()
    while not standby.follow.consumers:  # noqa: ASYNC110 (the index is filled; queueing began)
        await asyncio.sleep(0)
    assert not standby.follow.indexed
    assert await standby.take() is None
