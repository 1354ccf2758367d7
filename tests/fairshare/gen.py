"""Random clusters, queues and units for the fair-share tests.

Amounts are small so that ties, exact fits, capabilities and guarantees all
happen often; a resource may have capacity 0 (units requesting it never fit)
and some units belong to a queue that does not exist.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import strategies as st

from arbiter.core.model import QueuePolicy, QueueSpec, Unit
from arbiter.core.resources import EMPTY, Resources

RESOURCES = ("cpu", "memory", "gpu")
QUEUE_NAMES = ("a", "b", "c", "d", "e")
UNKNOWN_QUEUE = "zz"


@dataclass
class Case:
    capacity: Resources
    queues: list[QueueSpec]
    pending: list[Unit]
    admitted: list[Unit] = field(default_factory=list)


def _vector(rng: random.Random, high: int, density: float = 0.6) -> Resources:
    return Resources({r: rng.randint(0, high) for r in RESOURCES if rng.random() < density})


def random_spec(rng: random.Random, name: str) -> QueueSpec:
    policy: QueuePolicy = "FIFO" if rng.random() < 0.3 else "Priority"
    return QueueSpec(
        name=name,
        weight=rng.choice((1, 1, 2, 3)),
        guarantee=_vector(rng, 6, 0.4) if rng.random() < 0.5 else EMPTY,
        capability=_vector(rng, 10, 0.4) if rng.random() < 0.4 else EMPTY,
        blocking=rng.random() < 0.25,
        policy=policy,
    )


def random_unit(
    rng: random.Random, key: str, queues: list[str], shapes: list[Resources] | None = None
) -> Unit:
    """A random unit; with `shapes`, its demand is one of those (many equal demands)."""
    queue = UNKNOWN_QUEUE if rng.random() < 0.05 else rng.choice(queues)
    demand = rng.choice(shapes) if shapes else _vector(rng, 4, 0.7)
    if rng.random() < 0.05:
        demand = EMPTY
    return Unit(
        key=key,
        queue=queue,
        demand=demand,
        priority=rng.randint(0, 2),
        created=float(rng.randint(0, 6)),
    )


def random_capacity(rng: random.Random) -> Resources:
    return Resources(
        {
            "cpu": rng.randint(0, 14),
            "memory": rng.randint(0, 14),
            "gpu": rng.choice((0, 0, 1, 2, 4)),
        }
    )


def random_case(rng: random.Random, max_queues: int = 5, max_units: int = 16) -> Case:
    names = list(QUEUE_NAMES[: rng.randint(1, max_queues)])
    rng.shuffle(names)
    queues = [random_spec(rng, name) for name in names]
    units = [random_unit(rng, f"u{i}", names) for i in range(rng.randint(0, max_units))]
    admitted_count = rng.randint(0, min(3, len(units)))
    return Case(random_capacity(rng), queues, units[admitted_count:], units[:admitted_count])


@st.composite
def cases(draw: st.DrawFn, max_queues: int = 5, max_units: int = 14) -> Case:
    """Hypothesis version of random_case (shrinks to small counterexamples)."""
    amounts = st.integers(min_value=0, max_value=4)
    vectors = st.dictionaries(st.sampled_from(RESOURCES), amounts).map(Resources)
    names = draw(
        st.lists(st.sampled_from(QUEUE_NAMES), min_size=1, max_size=max_queues, unique=True)
    )
    queues = [
        QueueSpec(
            name=name,
            weight=draw(st.integers(min_value=1, max_value=3)),
            guarantee=draw(
                st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 6)).map(Resources)
            ),
            capability=draw(
                st.one_of(
                    st.just(EMPTY),
                    st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 10)).map(Resources),
                )
            ),
            blocking=draw(st.booleans()),
            policy=draw(st.sampled_from(("Priority", "FIFO"))),
        )
        for name in names
    ]
    count = draw(st.integers(min_value=0, max_value=max_units))
    units = [
        Unit(
            key=f"u{i}",
            queue=draw(st.sampled_from([*names, UNKNOWN_QUEUE])),
            demand=draw(vectors),
            priority=draw(st.integers(0, 2)),
            created=float(draw(st.integers(0, 5))),
        )
        for i in range(count)
    ]
    capacity = Resources(
        {
            "cpu": draw(st.integers(0, 14)),
            "memory": draw(st.integers(0, 14)),
            "gpu": draw(st.sampled_from((0, 1, 2, 4))),
        }
    )
    admitted = draw(st.integers(min_value=0, max_value=min(3, count)))
    return Case(capacity, queues, units[admitted:], units[:admitted])
