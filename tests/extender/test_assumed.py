"""Approved-but-not-bound pods: per-queue sums, renewal, expiry."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.core.resources import Resources
from extender.assumed import AssumedPods


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cpu(milli: int) -> Resources:
    return Resources({"cpu": milli})


def test_usage_sums_per_queue_and_can_exclude_a_pod() -> None:
    assumed = AssumedPods(10, Clock())
    assumed.assume("u1", "a", cpu(500))
    assumed.assume("u2", "a", cpu(250))
    assumed.assume("u3", "b", cpu(1000))
    assert assumed.usage("a") == cpu(750)
    assert assumed.usage("a", excluding="u1") == cpu(250)
    assert assumed.usage("a", excluding="u3") == cpu(750)  # not in queue a
    assert assumed.usage("c").is_zero()


def test_renewing_does_not_double_count_and_moves_expiry() -> None:
    clock = Clock()
    assumed = AssumedPods(10, clock)
    assumed.assume("u1", "a", cpu(500))
    assumed.assume("u2", "a", cpu(100))
    clock.now = 8
    assumed.assume("u1", "a", cpu(500))
    assert assumed.usage("a") == cpu(600)
    clock.now = 12  # u2 expired; u1 renewed at 8 lives until 18
    assert assumed.usage("a") == cpu(500)
    assert "u2" not in assumed
    assert "u1" in assumed
    clock.now = 18
    assert len(assumed) == 0


def test_forget_and_zero_request_pods() -> None:
    assumed = AssumedPods(10, Clock())
    assumed.assume("z1", "a", Resources())
    assumed.assume("z2", "a", Resources())
    assumed.forget("z1")
    assumed.forget("z2")
    assumed.forget("never-seen")
    assert assumed.usage("a").is_zero()
    assert len(assumed) == 0


def test_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        AssumedPods(0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["assume", "forget", "tick"]), st.integers(0, 4),
                          st.sampled_from(["a", "b"]), st.integers(0, 2000))))
def test_sums_match_live_entries(ops: list[tuple[str, int, str, int]]) -> None:
    clock = Clock()
    assumed = AssumedPods(5, clock)
    for op, pod, queue, milli in ops:
        if op == "assume":
            assumed.assume(f"u{pod}", queue, cpu(milli))
        elif op == "forget":
            assumed.forget(f"u{pod}")
        else:
            clock.now += milli / 1000
        for name in ("a", "b"):
            live = [assumed.get(f"u{i}") for i in range(5)]
            expected = sum(e.requests.get_amount("cpu") for e in live if e and e.queue == name)
            assert assumed.usage(name).get_amount("cpu") == expected


def test_every_queue_expires_on_insert_and_the_table_is_bounded() -> None:
    """Approvals for queues nobody asks `usage()` of (no capability) expire
    too: 2,000 random uids are gone once the TTL has passed, and the table
    never holds more than its bound (the oldest entries go first)."""
    clock = Clock()
    assumed = AssumedPods(30, clock, max_entries=500)
    rng = random.Random(13)
    uids = [f"{rng.getrandbits(64):016x}" for _ in range(2000)]
    for index, uid in enumerate(uids):
        assumed.assume(uid, f"queue-{index % 7}", cpu(100))
        assert assumed.stored <= 500
        clock.now += 0.001
    # The oldest were dropped first: the newest 500 are kept.
    assert assumed.get(uids[-1]) is not None and assumed.get(uids[-501]) is None
    clock.now += 31
    assumed.assume("after-the-ttl", "other", cpu(1))
    assert assumed.stored == 1
    assert all(assumed.usage(f"queue-{q}").is_zero() for q in range(7))


def test_bound_must_be_positive() -> None:
    with pytest.raises(ValueError):
        AssumedPods(10, max_entries=0)
