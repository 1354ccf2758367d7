"""Leader election on a coordination.k8s.io/v1 Lease."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from arbiter.base import metrics
from arbiter.base.aio import wait_event
from arbiter.base.kubeapi import Conflict, lease_path
from arbiter.loop.leader import LeaderElector, LeaseTiming
from arbiter.testing.memory import InMemoryApi
from tests.loop.harness import Clock, eventually

PATH = lease_path("arbiter-system", "kube-arbiter")


def elector(api: InMemoryApi, identity: str, clock: Clock,
            timing: LeaseTiming | None = None) -> LeaderElector:
    return LeaderElector(api, "arbiter-system", "kube-arbiter", identity, timing,
                         clock=clock, wall=clock)


def spec(api: InMemoryApi) -> dict[str, Any]:
    return dict(api.objects[PATH]["spec"])


async def test_the_first_candidate_creates_and_holds_the_lease() -> None:
    api, clock = InMemoryApi(), Clock()
    one, two = elector(api, "one", clock), elector(api, "two", clock)
    assert await one.try_acquire_or_renew()
    assert not await two.try_acquire_or_renew()
    lease = spec(api)
    assert lease["holderIdentity"] == "one"
    assert lease["leaseDurationSeconds"] == 15
    assert lease["leaseTransitions"] == 0
    assert lease["renewTime"].endswith("Z") and "." in lease["renewTime"]  # MicroTime


async def test_renewing_keeps_others_out_past_the_duration() -> None:
    api, clock = InMemoryApi(), Clock()
    one, two = elector(api, "one", clock), elector(api, "two", clock)
    assert await one.try_acquire_or_renew()
    for _ in range(10):
        clock.advance(5)
        assert await one.try_acquire_or_renew()
        assert not await two.try_acquire_or_renew()
    assert spec(api)["holderIdentity"] == "one"


async def test_a_silent_holder_is_replaced_after_the_lease_duration() -> None:
    api, clock = InMemoryApi(), Clock()
    one, two = elector(api, "one", clock), elector(api, "two", clock)
    assert await one.try_acquire_or_renew()
    assert not await two.try_acquire_or_renew()  # two starts observing now
    clock.advance(14)
    assert not await two.try_acquire_or_renew()
    clock.advance(2)
    assert await two.try_acquire_or_renew()
    lease = spec(api)
    assert lease["holderIdentity"] == "two" and lease["leaseTransitions"] == 1
    assert not await one.try_acquire_or_renew()  # the old holder sees it is out


async def test_a_released_lease_is_taken_at_once() -> None:
    api, clock = InMemoryApi(), Clock()
    one, two = elector(api, "one", clock), elector(api, "two", clock)
    assert await one.try_acquire_or_renew()
    await one.release()
    assert spec(api)["holderIdentity"] == ""
    assert await two.try_acquire_or_renew()


class Interleaving(InMemoryApi):
    """Yields after each read, so two candidates both read before either writes."""

    async def get(self, path: str) -> dict[str, Any]:
        obj = await super().get(path)
        await asyncio.sleep(0)
        return obj


async def test_racing_candidates_cannot_both_win() -> None:
    api, clock = Interleaving(), Clock()
    one, two = elector(api, "one", clock), elector(api, "two", clock)
    assert await one.try_acquire_or_renew()
    await one.release()
    # Both read the free lease; only the first update under its version wins.
    results = await asyncio.gather(one.try_acquire_or_renew(), two.try_acquire_or_renew())
    assert sorted(results) == [False, True]


def test_timing_must_leave_room_to_stop_before_takeover() -> None:
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_duration"):
        LeaseTiming(lease_duration=10, renew_deadline=10, retry_period=2)


FAST = LeaseTiming(lease_duration=0.6, renew_deadline=0.4, retry_period=0.05)


async def test_leadership_is_lost_when_renewals_fail_for_the_deadline() -> None:
    api = InMemoryApi()
    one = LeaderElector(api, "arbiter-system", "kube-arbiter", "one", FAST)
    await one.acquire()
    api.hooks.append(lambda m, p, _: Conflict(409, "Conflict", "no") if m == "PUT" else None)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(3):
        await one.hold()
    assert 0.35 <= loop.time() - started < 1.0


async def test_only_the_holder_leads_and_a_standby_takes_over() -> None:
    api = InMemoryApi()
    leading: list[str] = []

    def lead_as(name: str) -> Any:
        async def lead() -> None:
            leading.append(name)
            try:
                await asyncio.Event().wait()
            finally:
                leading.remove(name)
        return lead

    one = LeaderElector(api, "arbiter-system", "kube-arbiter", "one", FAST)
    two = LeaderElector(api, "arbiter-system", "kube-arbiter", "two", FAST)
    first = asyncio.ensure_future(one.run(lead_as("one")))
    await asyncio.sleep(0.1)
    second = asyncio.ensure_future(two.run(lead_as("two")))
    try:
        await asyncio.sleep(0.4)
        assert leading == ["one"]
        assert metrics.REGISTRY.get_sample_value("arbiter_leader") == 1
        first.cancel()  # a clean shutdown releases the lease
        with pytest.raises(asyncio.CancelledError):
            await first
        await eventually(lambda: leading == ["two"], within=2)
        assert spec(api)["holderIdentity"] == "two"
    finally:
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
    assert leading == []
    assert spec(api)["holderIdentity"] == ""
    assert metrics.REGISTRY.get_sample_value("arbiter_leader") == 0


async def test_work_that_swallows_a_cancel_still_stops_when_the_lease_is_lost() -> None:
    """Python 3.11's `asyncio.wait_for` drops a cancellation that meets its
    inner result (an admission loop's wake event, set all the time under
    load): the leader's work must stop anyway, not run beside the next
    leader's."""
    api = InMemoryApi()
    running = asyncio.Event()
    swallowed = 0

    async def lead() -> None:
        nonlocal swallowed
        running.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # as the old wait_for could: carry on

    one = LeaderElector(api, "arbiter-system", "kube-arbiter", "one", FAST)
    runner = asyncio.ensure_future(one.run(lead))
    try:
        await asyncio.wait_for(running.wait(), 2)
        api.hooks.append(lambda m, p, _: Conflict(409, "Conflict", "no") if m == "PUT" else None)
        await eventually(lambda: not one.leading, within=4)
        assert swallowed == 1
        assert metrics.REGISTRY.get_sample_value("arbiter_leader") == 0
    finally:
        runner.cancel()
        done, _ = await asyncio.wait({runner}, timeout=3)
        assert runner in done, "the elector never stopped its work"


async def test_wait_event_keeps_a_cancel_that_meets_the_event() -> None:
    event = asyncio.Event()
    waiter = asyncio.ensure_future(wait_event(event, 60))
    await asyncio.sleep(0)
    event.set()
    waiter.cancel()  # in the same loop turn as the event
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await wait_event(event, 0.01) is True
    assert await wait_event(asyncio.Event(), 0.01) is False


class SlowWrites(InMemoryApi):
    """Answers every update `delay` seconds late (a loaded apiserver)."""

    def __init__(self) -> None:
        super().__init__()
        self.delay = 0.0

    async def replace(self, path: str, body: Any) -> dict[str, Any]:
        await asyncio.sleep(self.delay)
        return await super().replace(path, body)


async def test_a_holder_renews_with_one_update_and_reads_only_after_a_conflict() -> None:
    api = InMemoryApi()
    one = LeaderElector(api, "arbiter-system", "kube-arbiter", "one", FAST)
    await one.acquire()
    api.calls.clear()
    assert await one.try_acquire_or_renew()
    assert await one.try_acquire_or_renew()
    assert [method for method, _ in api.calls] == ["PUT", "PUT"]
    # Someone else took it meanwhile: the update conflicts, the read shows it.
    lease = api.objects[PATH]
    api.objects[PATH] = {**lease, "metadata": {**lease["metadata"], "resourceVersion": "999"},
                         "spec": {**lease["spec"], "holderIdentity": "two"}}
    api.calls.clear()
    assert not await one.try_acquire_or_renew()
    assert [method for method, _ in api.calls] == ["PUT", "GET"]
    assert spec(api)["holderIdentity"] == "two"


async def test_a_slow_renewal_within_the_deadline_keeps_the_lease() -> None:
    """Each renewal answered after 0.3 s: longer than two retry periods
    (0.1 s, where attempts used to be cut) but inside the 1 s deadline."""
    api = SlowWrites()
    timing = LeaseTiming(lease_duration=1.5, renew_deadline=1.0, retry_period=0.05)
    one = LeaderElector(api, "arbiter-system", "kube-arbiter", "one", timing)
    await one.acquire()
    api.delay = 0.3
    keeper = asyncio.ensure_future(one.hold())
    try:
        await asyncio.sleep(1.5)
        assert not keeper.done(), "a slow but timely renewal gave the lease up"
        api.delay = 5.0  # now past the deadline: it must stop leading
        async with asyncio.timeout(3):
            await keeper
    finally:
        keeper.cancel()
