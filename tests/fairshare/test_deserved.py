"""Deserved shares: continuous weighted DRF water-filling."""

from __future__ import annotations

import random
import time
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbiter.core.deserved import deserved
from arbiter.core.model import QueueSpec
from arbiter.core.resources import EMPTY, Resources
from tests.fairshare.deserved_oracle import deserved_reference
from tests.fairshare.gen import QUEUE_NAMES, RESOURCES

GI = 2**30


def test_drf_paper_example() -> None:
    capacity = Resources({"cpu": 9000, "memory": 18 * GI})
    queues = [QueueSpec("A"), QueueSpec("B")]
    demand = {
        "A": Resources({"cpu": 100_000, "memory": 400 * GI}),
        "B": Resources({"cpu": 300_000, "memory": 100 * GI}),
    }
    result = deserved(capacity, queues, demand)
    assert result["A"] == Resources({"cpu": 3000, "memory": 12 * GI})
    assert result["B"] == Resources({"cpu": 6000, "memory": 2 * GI})


def test_weights() -> None:
    capacity = Resources({"cpu": 9000})
    queues = [QueueSpec("A", weight=2), QueueSpec("B", weight=1)]
    demand = {"A": Resources({"cpu": 100_000}), "B": Resources({"cpu": 100_000})}
    result = deserved(capacity, queues, demand)
    assert result == {"A": Resources({"cpu": 6000}), "B": Resources({"cpu": 3000})}


def test_small_demand_frees_the_rest_for_others() -> None:
    capacity = Resources({"cpu": 10_000})
    queues = [QueueSpec("small"), QueueSpec("big")]
    demand = {"small": Resources({"cpu": 2000}), "big": Resources({"cpu": 50_000})}
    result = deserved(capacity, queues, demand)
    assert result == {"small": Resources({"cpu": 2000}), "big": Resources({"cpu": 8000})}


def test_guarantee_floor_and_capability() -> None:
    capacity = Resources({"cpu": 12_000, "memory": 12 * GI})
    queues = [
        QueueSpec("g", guarantee=Resources({"cpu": 8000})),
        QueueSpec("c", capability=Resources({"cpu": 1000})),
        QueueSpec("x"),
    ]
    demand = {
        "g": Resources({"cpu": 20_000, "memory": 2 * GI}),
        "c": Resources({"cpu": 20_000, "memory": 2 * GI}),
        "x": Resources({"cpu": 20_000, "memory": 2 * GI}),
    }
    result = deserved(capacity, queues, demand)
    # c stops at its capability (1 cpu); g keeps its floor of 8; x gets the rest (3).
    assert result["c"]["cpu"] == 1000
    assert result["g"]["cpu"] == 8000
    assert result["x"]["cpu"] == 3000
    # g's floor is only in cpu: memory follows its demand's proportion at the level it froze.
    assert result["x"]["memory"] == 3 * 2 * GI // 20


def test_oversubscribed_guarantees_are_scaled_down() -> None:
    capacity = Resources({"cpu": 10_000})
    queues = [
        QueueSpec("a", guarantee=Resources({"cpu": 10_000})),
        QueueSpec("b", guarantee=Resources({"cpu": 30_000})),
    ]
    demand = {"a": Resources({"cpu": 50_000}), "b": Resources({"cpu": 50_000})}
    result = deserved(capacity, queues, demand)
    assert result == {"a": Resources({"cpu": 2500}), "b": Resources({"cpu": 7500})}


def test_resource_the_cluster_lacks_and_no_demand() -> None:
    capacity = Resources({"cpu": 8000})
    queues = [QueueSpec("gpu"), QueueSpec("cpu"), QueueSpec("idle")]
    demand = {
        "gpu": Resources({"cpu": 1000, "nvidia.com/gpu": 1}),
        "cpu": Resources({"cpu": 20_000}),
        "ghost": Resources({"cpu": 5000}),  # no such queue: ignored
    }
    result = deserved(capacity, queues, demand)
    # The GPU the cluster lacks takes no part in shares (issue #25 row 9):
    # gpu's share is its cpu demand, as if it named no GPU; it deserves no GPU.
    assert result == {"gpu": Resources({"cpu": 1000}), "cpu": Resources({"cpu": 7000}),
                      "idle": EMPTY}


def test_made_up_resources_cost_nothing_and_change_nothing() -> None:
    capacity = Resources({"cpu": 8000})
    queues = [QueueSpec("a"), QueueSpec("b")]
    plain = {"a": Resources({"cpu": 6000}), "b": Resources({"cpu": 6000})}
    hostile = {"a": Resources({"cpu": 6000, **{f"example.com/r-{i}": 1 for i in range(5000)}}),
               "b": plain["b"]}
    assert deserved(capacity, queues, hostile) == deserved(capacity, queues, plain) == {
        "a": Resources({"cpu": 4000}), "b": Resources({"cpu": 4000})}


def test_exact_fractions_floor() -> None:
    capacity = Resources({"cpu": 10})
    queues = [QueueSpec(n) for n in "abc"]
    demand = {n: Resources({"cpu": 100}) for n in "abc"}
    result = deserved(capacity, queues, demand)
    assert [result[n]["cpu"] for n in "abc"] == [3, 3, 3]


vectors = st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 30)).map(Resources)


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[Resources, list[QueueSpec], dict[str, Resources]]:
    capacity = draw(
        st.fixed_dictionaries({r: st.integers(0, 40) for r in RESOURCES}).map(Resources)
    )
    names = draw(st.lists(st.sampled_from(QUEUE_NAMES), min_size=1, unique=True))
    queues = [
        QueueSpec(
            n,
            weight=draw(st.integers(1, 4)),
            guarantee=draw(vectors),
            capability=draw(st.one_of(st.just(EMPTY), vectors)),
        )
        for n in names
    ]
    demand = {n: draw(vectors) for n in names}
    return capacity, queues, demand


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_deserved_bounds(scenario: tuple[Resources, list[QueueSpec], dict[str, Resources]]) -> None:
    capacity, queues, demand = scenario
    result = deserved(capacity, queues, demand)
    assert set(result) == {q.name for q in queues}
    total = sum(result.values(), Resources())
    assert total.fits_in(capacity)
    for q in queues:
        share = result[q.name]
        assert not share.has_negative()
        assert share.fits_in(demand[q.name])
        assert share.within_caps(q.capability)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_deserved_is_work_conserving_and_floored(
    scenario: tuple[Resources, list[QueueSpec], dict[str, Resources]],
) -> None:
    """A queue short of its demand is stopped by its capability or by an exhausted
    resource it needs; and when the floors fit, every queue gets its floor."""
    capacity, queues, demand = scenario
    result = deserved(capacity, queues, demand)
    total = sum(result.values(), Resources())
    slack = len(queues)  # flooring loses less than one unit per queue
    floors = {
        q.name: q.guarantee.minimum(demand[q.name]).minimum(
            Resources({r: q.capability.get(r, v) for r, v in demand[q.name].items()})
        )
        for q in queues
    }
    if sum(floors.values(), Resources()).fits_in(capacity):
        for q in queues:
            assert floors[q.name].fits_in(result[q.name])
    for q in queues:
        want = demand[q.name]
        got = result[q.name]
        if want.fits_in(got):
            continue
        capped = any(got.get_amount(r) >= v for r, v in q.capability.items() if want.get_amount(r))
        exhausted = any(
            total.get_amount(r) + slack > capacity.get_amount(r) for r in want if want[r] > 0
        )
        assert capped or exhausted, (q, want, got, total)


def test_weighted_shares_equal_when_unconstrained() -> None:
    capacity = Resources({"cpu": 60_000, "memory": 60 * GI})
    queues = [QueueSpec("a", weight=1), QueueSpec("b", weight=3)]
    demand = {
        "a": Resources({"cpu": 600_000, "memory": 60 * GI}),
        "b": Resources({"cpu": 60_000, "memory": 600 * GI}),
    }
    result = deserved(capacity, queues, demand)
    # Memory runs out first (a holds 6t GiB, b 180t GiB at level t), at t = 60/186.
    share_a = Fraction(result["a"]["cpu"], 60_000)
    share_b = Fraction(result["b"]["memory"], 60 * GI)
    assert abs(share_a - Fraction(60, 186)) < Fraction(1, 60_000)
    assert abs(share_b - 3 * Fraction(60, 186)) < Fraction(1, 60 * GI)
    total_memory = result["a"]["memory"] + result["b"]["memory"]
    assert 60 * GI - 2 <= total_memory <= 60 * GI


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_matches_the_plain_exact_implementation(
    scenario: tuple[Resources, list[QueueSpec], dict[str, Resources]],
) -> None:
    capacity, queues, demand = scenario
    assert deserved(capacity, queues, demand) == deserved_reference(capacity, queues, demand)


def test_many_distinct_queues_stay_fast_and_exact() -> None:
    """Distinct weights and demands make the exact sums big; it must stay quick."""
    rng = random.Random(3)
    capacity = Resources(
        {"cpu": 10**7 + 7, "memory": 10**14 + 13, "nvidia.com/gpu": 997, "pods": 50021}
    )
    queues = [
        QueueSpec(
            f"q{i}",
            weight=rng.randint(1, 97),
            guarantee=Resources({"cpu": rng.randint(0, 2000)}) if i % 3 == 0 else EMPTY,
            capability=Resources({"memory": rng.randint(10**9, 10**12)}) if i % 4 == 0 else EMPTY,
        )
        for i in range(150)
    ]
    demand = {
        q.name: Resources(
            {
                "cpu": rng.randint(1, 10**6),
                "memory": rng.randint(1, 10**13),
                "nvidia.com/gpu": rng.randint(0, 50),
                "pods": rng.randint(1, 500),
            }
        )
        for q in queues
    }
    started = time.process_time()
    result = deserved(capacity, queues, demand)
    elapsed = time.process_time() - started
    assert result == deserved_reference(capacity, queues, demand)
    assert elapsed < 2.0
