"""The incremental engine must agree with the plain rescan, step for step."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings

from arbiter.core.engine import flat as fairshare
from arbiter.core.engine.flat import AdmissionEngine, admission_order
from arbiter.core.model import QueueSpec, Unit
from arbiter.core.resources import Resources
from tests.fairshare.gen import (
    QUEUE_NAMES,
    Case,
    cases,
    random_capacity,
    random_case,
    random_spec,
    random_unit,
)


def keys(units: list[Unit]) -> list[str]:
    return [u.key for u in units]


def engine_for(case: Case) -> AdmissionEngine:
    engine = AdmissionEngine(case.capacity, case.queues)
    for unit in case.admitted:
        engine.add_admitted(unit)
    for unit in case.pending:
        engine.add_pending(unit)
    return engine


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_engine_matches_rescan(case: Case) -> None:
    expected = admission_order(case.capacity, case.queues, case.pending, case.admitted)
    assert keys(engine_for(case).admit_all()) == keys(expected)


@pytest.mark.parametrize("seed", range(4))
def test_engine_matches_rescan_seeded(seed: int) -> None:
    """Thousands of plain random cases (cheaper than hypothesis per case)."""
    rng = random.Random(seed)
    for _ in range(750):
        case = random_case(rng, max_units=rng.choice((6, 16, 30)))
        expected = admission_order(case.capacity, case.queues, case.pending, case.admitted)
        got = engine_for(case).admit_all()
        assert keys(got) == keys(expected), case


def test_build_order_does_not_matter() -> None:
    """Units added before or after the queues, admitted interleaved: same answer."""
    rng = random.Random(7)
    for _ in range(300):
        case = random_case(rng)
        expected = keys(admission_order(case.capacity, case.queues, case.pending, case.admitted))
        engine = AdmissionEngine(Resources())
        for unit in [*case.pending]:
            engine.add_pending(unit)
        for unit in case.admitted:
            engine.add_admitted(unit)
        assert engine.next() is None  # no capacity and no queues yet
        for spec in case.queues:
            engine.add_queue(spec)
        engine.set_capacity(case.capacity)
        assert keys(engine.admit_all()) == expected


class Model:
    """What the engine should hold, kept the obvious way."""

    def __init__(self, capacity: Resources, queues: list[QueueSpec]) -> None:
        self.capacity = capacity
        self.queues = {q.name: q for q in queues}
        self.pending: dict[str, Unit] = {}
        self.admitted: dict[str, Unit] = {}

    def order(self) -> list[Unit]:
        return admission_order(
            self.capacity,
            self.queues.values(),
            self.pending.values(),
            self.admitted.values(),
        )


def run_random_session(seed: int, steps: int, few_shapes: bool = False) -> int:
    """Random events; after each, the engine's next decisions match the rescan."""
    rng = random.Random(seed)
    capacity = random_capacity(rng)
    shapes = None
    if few_shapes:
        shapes = [
            Resources({"cpu": rng.randint(1, 3), "memory": rng.randint(0, 3)})
            for _ in range(rng.randint(1, 3))
        ]
    names = list(QUEUE_NAMES[: rng.randint(1, 5)])
    specs = [random_spec(rng, n) for n in names]
    model = Model(capacity, specs)
    engine = AdmissionEngine(capacity, specs)
    serial = 0
    checks = 0
    for _ in range(steps):
        op = rng.random()
        if op < 0.35:
            serial += 1
            unit = random_unit(rng, f"u{serial}", names, shapes)
            if model.pending and rng.random() < 0.05:
                # Replace a pending unit under the same key.
                old = rng.choice(sorted(model.pending))
                unit = Unit(old, unit.queue, unit.demand, unit.priority, unit.created)
            model.pending[unit.key] = unit
            engine.add_pending(unit)
        elif op < 0.45 and model.pending:
            key = rng.choice(sorted(model.pending))
            del model.pending[key]
            engine.remove_pending(key)
        elif op < 0.6 and model.admitted:
            key = rng.choice(sorted(model.admitted))
            del model.admitted[key]
            engine.release(key)
        elif op < 0.65:
            serial += 1
            unit = random_unit(rng, f"u{serial}", names, shapes)
            if model.pending and rng.random() < 0.5:
                unit = model.pending.pop(rng.choice(sorted(model.pending)))
            model.admitted[unit.key] = unit
            engine.add_admitted(unit)
        elif op < 0.7:
            spec = random_spec(rng, rng.choice(names))
            model.queues[spec.name] = spec
            engine.add_queue(spec)
        elif op < 0.72:
            name = rng.choice(names)
            model.queues.pop(name, None)
            engine.remove_queue(name)
        elif op < 0.76:
            model.capacity = random_capacity(rng)
            engine.set_capacity(model.capacity)
        else:
            # Admit a few, checking each decision against the rescan.
            for _ in range(rng.randint(1, 4)):
                expected = model.order()
                got = engine.next()
                checks += 1
                if not expected:
                    assert got is None
                    break
                assert got is not None and got.key == expected[0].key, (seed, expected, got)
                del model.pending[got.key]
                model.admitted[got.key] = got
        # The engine's view of the queues matches the model.
        if rng.random() < 0.1:
            for name in names:
                assert engine.allocated(name) == sum(
                    (u.demand for u in model.admitted.values() if u.queue == name), Resources()
                )
    # Drain and compare the rest.
    assert keys(engine.admit_all()) == keys(model.order())
    return checks


@pytest.mark.parametrize("seed", range(12))
def test_event_sessions_match_rescan(seed: int) -> None:
    checks = sum(run_random_session(seed * 1000 + i, 120) for i in range(25))
    assert checks > 100


@pytest.mark.parametrize("seed", range(6))
def test_event_sessions_with_few_shapes_match_rescan(seed: int) -> None:
    """Many equal demands per queue: the per-shape heaps carry the work."""
    checks = sum(run_random_session(seed * 1000 + i, 150, few_shapes=True) for i in range(25))
    assert checks > 100


@pytest.mark.parametrize("seed", range(4))
def test_event_sessions_with_eager_compaction(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compact shapes as early as possible: index bookkeeping must survive it."""
    monkeypatch.setattr(fairshare, "TIDY_MIN", 0)
    checks = sum(run_random_session(seed * 1000 + i, 150, few_shapes=i % 2 == 0) for i in range(25))
    assert checks > 100
