"""Properties of admission over random clusters, queues and units (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbiter.core.engine.flat import AdmissionEngine
from arbiter.core.model import QueueSpec, Unit
from arbiter.core.resources import EMPTY, Resources
from tests.fairshare.gen import RESOURCES, Case, cases

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def admit(case: Case) -> tuple[AdmissionEngine, list[Unit]]:
    engine = AdmissionEngine(case.capacity, case.queues)
    for unit in case.admitted:
        engine.add_admitted(unit)
    for unit in case.pending:
        engine.add_pending(unit)
    return engine, engine.admit_all()


def fits(engine: AdmissionEngine, spec: QueueSpec, unit: Unit) -> bool:
    held = engine.allocated(spec.name)
    within = all(
        held.get_amount(r) + v <= spec.capability[r]
        for r, v in unit.demand.items()
        if r in spec.capability
    )
    return within and unit.demand.fits_in(engine.free())


@SETTINGS
@given(cases())
def test_never_over_capacity_or_capability(case: Case) -> None:
    case.admitted = []
    engine, admitted = admit(case)
    used = sum((u.demand for u in admitted), Resources())
    assert used.fits_in(case.capacity)
    assert engine.free() == case.capacity - used
    for spec in case.queues:
        held = engine.allocated(spec.name)
        assert held == sum((u.demand for u in admitted if u.queue == spec.name), Resources())
        assert held.within_caps(spec.capability)


@SETTINGS
@given(cases())
def test_each_admission_fitted_when_made(case: Case) -> None:
    """Also with units admitted beforehand (which may over-commit the cluster)."""
    engine = AdmissionEngine(case.capacity, case.queues)
    for unit in case.admitted:
        engine.add_admitted(unit)
    for unit in case.pending:
        engine.add_pending(unit)
    specs = {q.name: q for q in case.queues}
    while True:
        before_free = engine.free()
        before = {name: engine.allocated(name) for name in specs}
        step = engine.next()
        if step is None:
            break
        unit = step
        spec = specs[unit.queue]
        assert unit.demand.fits_in(before_free)
        assert all(
            before[unit.queue].get_amount(r) + v <= spec.capability[r]
            for r, v in unit.demand.items()
            if r in spec.capability
        )


@SETTINGS
@given(cases())
def test_at_the_end_nothing_fits(case: Case) -> None:
    engine, _ = admit(case)
    for spec in case.queues:
        waiting = engine.pending(spec.name)
        if spec.blocking:
            # Only the head is ever offered; it must not fit.
            assert not waiting or not fits(engine, spec, waiting[0])
        else:
            assert not any(fits(engine, spec, u) for u in waiting)


@st.composite
def guaranteed_cases(draw: st.DrawFn) -> Case:
    """Guarantees that fit in the capacity; each queue submits one shape of unit.

    (With several shapes the rule of §4 can legitimately starve a guarantee: the
    under-guarantee flag is that of the queue's *first fitting* unit, so a big
    unit ahead of a small one that would be under guarantee competes by share
    alone; `growing_cases` has the mixed sizes where the property holds, and
    shuffling those same units finds counterexamples.)
    """
    base = draw(cases(max_units=0))
    vectors = st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 4)).map(Resources)
    # Guarantees carve up (part of) the capacity: large enough that plain DRF,
    # with unequal weights, would not honour them.
    left = dict(base.capacity)
    queues = []
    for q in base.queues:
        guarantee = {}
        for r in RESOURCES:
            guarantee[r] = draw(st.integers(0, left.get(r, 0)))
            left[r] = left.get(r, 0) - guarantee[r]
        queues.append(
            QueueSpec(
                q.name,
                draw(st.integers(1, 4)),
                Resources(guarantee),
                q.capability,
                q.blocking,
                q.policy,
            )
        )
    total = sum((q.guarantee for q in queues), Resources())
    assert total.fits_in(base.capacity)
    pending: list[Unit] = []
    for q in queues:
        shape = draw(vectors)
        for _ in range(draw(st.integers(0, 8))):
            pending.append(
                Unit(
                    f"u{len(pending)}",
                    q.name,
                    shape,
                    priority=draw(st.integers(0, 2)),
                    created=float(len(pending)),
                )
            )
    return Case(base.capacity, queues, pending)


@st.composite
def growing_cases(draw: st.DrawFn) -> Case:
    """Like `guaranteed_cases`, but each queue submits units of mixed sizes
    that never shrink in queue order (each unit is the one before plus a
    random increment, on every resource).

    Here the guarantee property holds with mixed sizes: once a queue's first
    fitting unit is over its guarantee, every unit behind it is too, so the
    under-guarantee flag of the first fitting unit speaks for the whole queue.
    """
    case = draw(guaranteed_cases())
    increments = st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 2)).map(Resources)
    pending: list[Unit] = []
    for spec in case.queues:
        shape = draw(st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 3)).map(Resources))
        for _ in range(draw(st.integers(0, 8))):
            # One priority: queue order is submission order (`created`).
            pending.append(Unit(f"u{len(pending)}", spec.name, shape,
                                created=float(len(pending))))
            shape = shape + draw(increments)
    return Case(case.capacity, case.queues, pending)


def assert_guarantees_honoured(case: Case) -> None:
    """No unit that would keep its queue within its guarantee is left waiting."""
    engine, _ = admit(case)
    for spec in case.queues:
        held = engine.allocated(spec.name)
        for unit in engine.pending(spec.name):
            within_guarantee = all(
                held.get_amount(r) + v <= spec.guarantee.get_amount(r)
                for r, v in unit.demand.items()
            )
            within_capability = all(
                held.get_amount(r) + v <= spec.capability[r]
                for r, v in unit.demand.items()
                if r in spec.capability
            )
            assert not (within_guarantee and within_capability), (spec, unit, held)


@SETTINGS
@given(guaranteed_cases())
def test_guarantees_honoured(case: Case) -> None:
    """One shape of unit per queue."""
    assert_guarantees_honoured(case)


@SETTINGS
@given(growing_cases())
def test_guarantees_honoured_with_mixed_sizes_that_grow_in_queue_order(case: Case) -> None:
    assert_guarantees_honoured(case)


@SETTINGS
@given(
    queues=st.integers(1, 6),
    demand=st.dictionaries(st.sampled_from(RESOURCES), st.integers(1, 5), min_size=1).map(
        Resources
    ),
    capacity=st.fixed_dictionaries({r: st.integers(0, 40) for r in RESOURCES}).map(Resources),
    priorities=st.lists(st.integers(0, 3), min_size=60, max_size=60),
    blocking=st.booleans(),
)
def test_equal_weights_identical_demands_within_one(
    queues: int,
    demand: Resources,
    capacity: Resources,
    priorities: list[int],
    blocking: bool,
) -> None:
    names = [f"q{i}" for i in range(queues)]
    specs = [QueueSpec(n, blocking=blocking) for n in names]
    # Enough units per queue that no queue runs out before the cluster does.
    per_queue = 41
    pending = [
        Unit(f"{n}/{i}", n, demand, priority=priorities[i % 60], created=float(i))
        for n in names
        for i in range(per_queue)
    ]
    engine = AdmissionEngine(capacity, specs)
    for unit in pending:
        engine.add_pending(unit)
    engine.admit_all()
    counts = [engine.admitted_count(n) for n in names]
    assert max(counts) - min(counts) <= 1
    assert max(counts) < per_queue


def test_weights_are_proportional_with_identical_demands() -> None:
    capacity = Resources({"cpu": 60})
    specs = [QueueSpec("a", weight=1), QueueSpec("b", weight=2), QueueSpec("c", weight=3)]
    engine = AdmissionEngine(capacity, specs)
    for spec in specs:
        for i in range(100):
            engine.add_pending(Unit(f"{spec.name}/{i}", spec.name, Resources({"cpu": 1})))
    engine.admit_all()
    assert [engine.admitted_count(s.name) for s in specs] == [10, 20, 30]
    assert engine.allocated("a") == Resources({"cpu": 10})
    assert engine.free() == EMPTY
