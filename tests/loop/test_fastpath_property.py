"""The fast path never admits out of DRF order: over random clusters, what
the leader's webhook decides for a new Job is what the loop would have
decided for it held (DESIGN §16). Twin clusters are built alike; in one the
Job goes through the fast path question, in the other it is created held
and the loop runs: the same units end up admitted, the Job in the same pool
and on the same nodes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from arbiter.core.api import ADMITTED_PHASES
from tests.loop.harness import Cluster
from tests.loop.test_fastpath import KEY, create

SEEDS = range(40)


async def build(seed: int) -> tuple[Cluster, dict[str, Any]]:
    rng = random.Random(seed)
    c = Cluster(fast_path_key=KEY)
    for index in range(rng.randint(1, 3)):
        await c.node(f"node-{index}", cpu=str(rng.randint(1, 4)))
    queues = [f"q{index}" for index in range(rng.randint(1, 3))]
    for name in queues:
        spec: dict[str, Any] = {"weight": rng.randint(1, 3), "blocking": rng.random() < 0.3}
        if rng.random() < 0.3:
            spec["capability"] = {"cpu": str(rng.randint(1, 4))}
        if rng.random() < 0.3:
            spec["guarantee"] = {"cpu": str(rng.randint(1, 2))}
        await c.queue(name, **spec)
    jobs = []
    for index in range(rng.randint(0, 7)):
        name = f"j{index}"
        queue = rng.choice(queues)
        await c.job(f"ns-{queue}", name, queue, cpu=str(rng.randint(1, 3)),
                    parallelism=rng.randint(1, 2))
        jobs.append((f"ns-{queue}", name))
        c.clock.advance(1)
    await c.settle()
    for namespace, name in jobs:  # some finish: the loop has not seen it yet
        if not c.suspended(namespace, name) and rng.random() < 0.4:
            c.finish_job(namespace, name)
    c.clock.advance(1)
    queue = rng.choice(queues)
    new = {"namespace": f"ns-{queue}", "name": "new", "queue": queue,
           "cpu": str(rng.randint(1, 3)), "parallelism": rng.randint(1, 2)}
    return c, new


def admitted(c: Cluster) -> dict[str, Any]:
    return {key: (u.admission.pool if u.admission else None,
                  dict(u.admission.nodes) if u.admission else None)
            for key, u in c.store.units.items() if u.phase in ADMITTED_PHASES}


@pytest.mark.parametrize("seed", SEEDS)
async def test_the_fast_path_decides_what_the_next_cycle_would(seed: int) -> None:
    fast, new = await build(seed)
    held, _ = await build(seed)
    decided = await create(fast, new["namespace"], new["name"], new["queue"],
                           cpu=new["cpu"], parallelism=new["parallelism"])
    await fast.settle()
    await held.job(new["namespace"], new["name"], new["queue"], cpu=new["cpu"],
                   parallelism=new["parallelism"])
    await held.settle()
    key = f"{new['namespace']}/job-new"
    assert admitted(fast) == admitted(held)
    assert (decided is not None) == (key in admitted(held))


async def test_the_random_clusters_take_both_paths() -> None:
    """The property means something only if both answers occur."""
    fast = 0
    for seed in SEEDS:
        c, new = await build(seed)
        decided = await create(c, new["namespace"], "new", new["queue"], cpu=new["cpu"],
                               parallelism=new["parallelism"])
        fast += decided is not None
    assert 5 <= fast <= len(SEEDS) - 5
