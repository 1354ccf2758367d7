"""The in-flight writes' lifecycle: assume → confirmed by the watch (or
expired), failed → retried after backoff, timers, busy keys, per-key locks."""

from __future__ import annotations

import asyncio
import math

import pytest

from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.records import UnitRecord
from arbiter.loop.consumers import Consumer
from arbiter.loop.inflight import ASSUME_TTL, VERSIONED_TTL, InFlightWrites

T0 = 1_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def unit(version: str, phase: str = "Enqueued") -> UnitRecord:
    return UnitRecord(uid="u", namespace="ns", name="job-a", queue="q",
                      phase=phase, resource_version=version)  # type: ignore[arg-type]


def writes(clock: Clock, **kwargs: object) -> InFlightWrites:
    return InFlightWrites(clock=clock, max_writes=kwargs.pop("max_writes", 4),  # type: ignore[arg-type]
                          retry_base=1.0, retry_max=8.0, **kwargs)  # type: ignore[arg-type]


def test_an_assumed_write_stands_in_until_the_watch_confirms_it() -> None:
    clock = Clock()
    told: list[str] = []
    w = writes(clock, on_assumed=lambda record: told.append(record.resource_version))
    old, ours = unit("1"), unit("2", "Dequeued")
    assert w.unit("ns/job-a", old) is old  # nothing assumed: the store's
    w.assume(ours)
    assert told == ["2"]
    assert w.unit("ns/job-a", old) is ours  # the watch is behind
    assert w.unit("ns/job-a", None) is ours  # not even created in the cache yet
    assert w.assumed_keys() == ["ns/job-a"]
    confirmed = unit("2", "Dequeued")
    assert w.unit("ns/job-a", confirmed) is confirmed  # the watch has it: store wins
    assert w.assumed_keys() == []
    assert w.unit("ns/job-a", old) is old  # and the assumption is gone for good


def test_an_assumed_write_stands_past_the_ttl_while_the_store_is_older() -> None:
    """Chaos run 16: the QueueUnit watch could not resume for 2 min (the
    apiserver's watch cache was reinitializing). The assumption expired and
    the loop saw again the Enqueued version its own admission had replaced."""
    clock = Clock()
    w = writes(clock)
    old, ours = unit("99"), unit("100", "Dequeued")
    w.assume(ours)
    clock.now += 10 * ASSUME_TTL
    assert w.unit("ns/job-a", old) is ours  # the store is behind our write
    newer = unit("101", "Enqueued")  # someone changed it after us: theirs stands
    assert w.unit("ns/job-a", newer) is newer
    assert w.assumed_keys() == []
    assert w.unit("ns/job-a", old) is old


def test_a_deleted_namesakes_older_version_does_not_end_an_assumption() -> None:
    # A unit re-created under a name whose deleted predecessor the lagging
    # watch still shows: the loop must see ours, or it could create another
    # unit for the same consumer.
    clock = Clock()
    w = writes(clock)
    ours = unit("100", "Dequeued")
    w.assume(ours)
    predecessor = UnitRecord(uid="v", namespace="ns", name="job-a", queue="q",
                             resource_version="99")
    clock.now += ASSUME_TTL + 0.1
    assert w.unit("ns/job-a", predecessor) is ours
    # A newer version under another uid has passed our write: it stands.
    successor = UnitRecord(uid="w", namespace="ns", name="job-a", queue="q",
                           resource_version="101")
    assert w.unit("ns/job-a", successor) is successor
    assert w.assumed_keys() == []


@pytest.mark.parametrize("stored", ["opaque-1", None])
def test_an_assumed_write_expires_when_the_versions_do_not_compare(
        stored: str | None) -> None:
    clock = Clock()
    w = writes(clock)
    old = unit(stored) if stored is not None else None
    ours = unit("opaque-2" if stored is not None else "2", "Dequeued")
    w.assume(ours)
    clock.now += ASSUME_TTL
    assert w.unit("ns/job-a", old) is ours
    clock.now += 0.1
    assert w.unit("ns/job-a", old) is old
    assert w.assumed_keys() == []


def test_a_failed_write_is_retried_after_a_doubling_capped_backoff() -> None:
    clock = Clock()
    w = writes(clock)
    delays = [w.failed("ns/job-a", RuntimeError("boom")) for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert w.retry_at("ns/job-a") == T0 + 8.0
    # A timer wakes the loop when the retry is due.
    assert w.timer_for("ns/job-a") == T0 + 8.0
    assert w.due(T0 + 0.9) == []
    assert w.due(T0 + 8.0) == ["ns/job-a"]  # once, though its timer moved four times
    assert w.timer_for("ns/job-a") is None and w.next_deadline() == math.inf
    w.succeeded("ns/job-a")
    assert w.retry_at("ns/job-a") == 0.0
    assert w.failed("ns/job-a", RuntimeError("again")) == 1.0  # counting starts over


def test_timers_fire_in_time_order_and_only_the_latest_per_key_counts() -> None:
    clock = Clock()
    w = writes(clock)
    assert w.next_deadline() == math.inf
    w.timer(T0 + 5, "b")
    w.timer(T0 + 3, "a")
    w.timer(T0 + 3, "a")  # the same time again: one timer
    w.timer(T0 + 9, "a")  # a later time: the key is due again then
    assert w.timer_for("a") == T0 + 9
    assert w.next_deadline() == T0 + 3
    assert w.due(T0 + 2.9) == []
    assert w.due(T0 + 5) == ["a", "b"]  # "a" at its first time too
    assert w.timer_for("a") == T0 + 9 and w.timer_for("b") is None
    assert w.due(T0 + 9) == ["a"]
    assert w.timer_for("a") is None and w.next_deadline() == math.inf


def test_forget_drops_a_gone_units_retry_timer_and_outdated_version() -> None:
    clock = Clock()
    w = writes(clock)
    w.failed("ns/job-a", RuntimeError("boom"))
    w.conflicted(unit("3"))
    assert w.outdated(unit("3"))
    w.forget("ns/job-a")
    assert w.retry_at("ns/job-a") == 0.0
    assert w.timer_for("ns/job-a") is None
    assert not w.outdated(unit("3"))


def test_a_refused_write_marks_that_version_outdated_until_a_newer_one_comes() -> None:
    w = writes(Clock())
    w.conflicted(unit("3"))
    assert w.outdated(unit("3"))
    assert w.outdated(unit("3"))  # asked again: still outdated
    assert not w.outdated(unit("4"))  # the watch brought a newer one
    assert not w.outdated(unit("3"))  # ... and the mark is gone


def test_a_consumer_override_holds_until_the_watch_moves_or_it_expires() -> None:
    clock = Clock()
    w = writes(clock)
    job = ConsumerKey("Job", "ns", "a")
    other = ConsumerKey("Job", "ns", "b")
    w.override(job, Consumer.RELEASED, Consumer.HELD)
    assert w.consumer(job, Consumer.HELD) is Consumer.RELEASED  # our unsuspend, unseen
    assert w.consumer(other, Consumer.HELD) is Consumer.HELD
    assert w.consumer(None, Consumer.NONE) is Consumer.NONE
    assert w.consumer(job, Consumer.RUNNING) is Consumer.RUNNING  # the watch moved on
    assert w.consumer(job, Consumer.HELD) is Consumer.HELD  # ... and the override is gone
    w.override(job, Consumer.RELEASED, Consumer.HELD)
    clock.now += ASSUME_TTL + 1
    assert w.consumer(job, Consumer.HELD) is Consumer.HELD  # expired
    w.override(job, Consumer.MISSING, Consumer.HELD)
    w.expire_overrides(clock.now + ASSUME_TTL + 1)
    assert w.consumer(job, Consumer.HELD) is Consumer.HELD


def test_a_consumer_override_with_a_version_stands_while_the_cache_is_older() -> None:
    """Our suspend landed at resourceVersion 20; a Job watch behind it (the
    cache at 15, unsuspended) does not bring the old Job back after the TTL,
    as it did in chaos run 25. A newer version, or one that does not
    compare, ends it as before; so does the bound."""
    clock = Clock()
    w = writes(clock)
    job = ConsumerKey("Job", "ns", "a")
    w.override(job, Consumer.HELD, Consumer.RELEASED, "20")
    clock.now += ASSUME_TTL * 4
    w.expire_overrides(clock.now)
    assert w.consumer(job, Consumer.RELEASED, "15") is Consumer.HELD  # the cache is behind
    assert w.consumer(job, Consumer.RELEASED, "21") is Consumer.RELEASED  # passed: changed since
    assert w.consumer(job, Consumer.RELEASED, "15") is Consumer.RELEASED  # ... and it is gone
    w.override(job, Consumer.HELD, Consumer.RELEASED, "20")
    assert w.consumer(job, Consumer.RELEASED, "") is Consumer.HELD  # no version: the TTL
    clock.now += ASSUME_TTL + 1
    assert w.consumer(job, Consumer.RELEASED, "") is Consumer.RELEASED
    w.override(job, Consumer.HELD, Consumer.RELEASED, "20")
    clock.now += VERSIONED_TTL + 1
    assert w.consumer(job, Consumer.RELEASED, "15") is Consumer.RELEASED  # the bound
    w.override(job, Consumer.HELD, Consumer.RELEASED, "20")
    w.expire_overrides(clock.now + VERSIONED_TTL + 1)
    assert w.consumer(job, Consumer.RELEASED, "15") is Consumer.RELEASED


async def test_a_key_is_busy_while_its_write_runs_even_when_the_write_fails() -> None:
    w = writes(Clock())
    gate = asyncio.Event()

    async def work() -> None:
        await gate.wait()
        raise RuntimeError("the write broke")

    w.spawn(work, key="ns/job-a")
    assert w.busy("ns/job-a") and w.busy_keys() == {"ns/job-a"}
    await asyncio.sleep(0)
    assert w.running() == 1 and w.busy("ns/job-a")
    gate.set()
    await w.wait()
    assert not w.busy("ns/job-a") and w.running() == 0


async def test_at_most_max_writes_run_at_once() -> None:
    w = writes(Clock(), max_writes=2)
    now_running = 0
    most = 0

    async def work() -> None:
        nonlocal now_running, most
        now_running += 1
        most = max(most, now_running)
        await asyncio.sleep(0.001)
        now_running -= 1

    for index in range(6):
        w.spawn(work, key=f"k{index}")
    await w.wait()
    assert most == 2 and w.busy_keys() == frozenset()


async def test_writes_on_one_key_take_turns_and_a_waiter_keeps_the_lock() -> None:
    w = writes(Clock())
    order: list[str] = []
    first_in = asyncio.Event()
    release_first = asyncio.Event()

    async def first() -> None:
        async with w.locked("k"):
            order.append("first in")
            first_in.set()
            await release_first.wait()
            order.append("first out")

    async def second() -> None:
        async with w.locked("k"):
            order.append("second in")
            await asyncio.sleep(0.001)
            order.append("second out")

    async def third() -> None:
        async with w.locked("k"):
            order.append("third in")
            order.append("third out")

    w.spawn(first)
    await first_in.wait()
    w.spawn(second)
    await asyncio.sleep(0)  # second waits for the lock
    release_first.set()
    await asyncio.sleep(0)  # first lets go; second is handed the lock
    w.spawn(third)  # arrives while second holds (or is about to hold) the lock
    await w.wait()
    assert order == ["first in", "first out", "second in", "second out",
                     "third in", "third out"]


async def test_close_cancels_the_writes_still_running() -> None:
    w = writes(Clock())
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    w.spawn(forever, key="k")
    await started.wait()
    await w.close()
    assert w.running() == 0 and not w.busy("k")


@pytest.mark.parametrize("attempt, delay", [(1, 1.0), (3, 4.0), (10, 8.0)])
def test_retry_delay_by_attempt(attempt: int, delay: float) -> None:
    w = writes(Clock())
    for _ in range(attempt - 1):
        w.failed("k", RuntimeError("x"))
    assert w.failed("k", RuntimeError("x")) == delay
