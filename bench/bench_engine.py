"""Benchmark the fair-share engine (DESIGN.md §9): not a test, prints numbers.

1,000 queues x 100,000 pending units over cpu, memory, nvidia.com/gpu and
pods, with a capacity that admits a large part of the demand. Measures:

* full admission: building the engine (queues + add_pending for every unit)
  and admit_all(); budget <= 1 s;
* incremental: after the full pass, release admitted units and time every
  next() until nothing fits, (a) after a batch release of 1 % of the admitted
  units and (b) in steady state, one release then the admissions it allows;
  budget <= 1 ms per admitted unit;
* deserved() over every queue's total demand;
* hierarchical queues (§11): the same queues as leaves of a 3-level tree,
  full admission against the flat full pass; target <= 1.5x;
* peak RSS.

With `--nodes N` (DESIGN §9, node fit): the same units, each split into its
`pods` count of equal pods, placed on N nodes (capacity = their sum) in two
pools, `gpu` and `default`; most queues name their pool, some narrow it by a
zone nodeSelector. Budget <= 2 s full, <= 2 ms p99 per admitted unit.

Run: `.venv/bin/python -m bench.bench_engine` (or `python bench/bench_engine.py`).
Options: --queues N --units N --seed N --fill F (capacity / total demand) --nodes N.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `arbiter` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arbiter.core.deserved import deserved
from arbiter.core.engine.flat import AdmissionEngine
from arbiter.core.engine.tree import HierarchicalEngine
from arbiter.core.model import Node, PodSet, Pool, QueueSpec, Unit
from arbiter.core.resources import EMPTY, Resources

GI = 2**30
MI = 2**20
GPU = "nvidia.com/gpu"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build_workload(
    queues: int, units: int, seed: int, fill: float
) -> tuple[Resources, list[QueueSpec], list[Unit]]:
    rng = random.Random(seed)
    names = [f"tenant-{i:04d}" for i in range(queues)]
    gpu_tenants = set(rng.sample(names, k=max(1, queues // 7)))
    # Skewed sizes: some tenants submit a lot more than others.
    shares = [rng.paretovariate(1.5) for _ in names]
    total_share = sum(shares)
    counts = [int(units * s / total_share) for s in shares]
    counts[0] += units - sum(counts)

    drafts: list[tuple[str, dict[str, int], int]] = []
    for name, count in zip(names, counts, strict=True):
        # Each tenant runs a few job templates (with some noise per unit).
        templates = []
        for _ in range(rng.randint(1, 4)):
            shape = {
                "cpu": rng.choice((250, 500, 1000, 2000, 4000, 8000)),
                "memory": rng.choice((512 * MI, 1 * GI, 2 * GI, 4 * GI, 8 * GI, 16 * GI)),
                "pods": rng.randint(1, 8),
            }
            if name in gpu_tenants:
                shape[GPU] = rng.choice((1, 1, 2, 4, 8))
            templates.append(shape)
        for _ in range(count):
            shape = dict(rng.choice(templates))
            if rng.random() < 0.3:
                shape["cpu"] = max(100, shape["cpu"] + rng.randint(-2, 2) * 100)
            drafts.append((name, shape, rng.choice((0, 0, 0, 1, 2))))
    # Submissions from all tenants interleave; creation time = submission order.
    rng.shuffle(drafts)
    pending = [
        Unit(
            key=f"ns-{name}/job-{serial}",
            queue=name,
            demand=Resources(shape),
            priority=priority,
            created=float(serial),
        )
        for serial, (name, shape, priority) in enumerate(drafts)
    ]

    total: dict[str, int] = {}
    for unit in pending:
        for r, v in unit.demand.items():
            total[r] = total.get(r, 0) + v
    capacity = Resources({r: int(v * fill) for r, v in total.items()})

    specs = []
    for name in names:
        guarantee = EMPTY
        capability = EMPTY
        if rng.random() < 0.2:
            guarantee = Resources(
                {"cpu": rng.randint(1, 20) * 1000, "memory": rng.randint(1, 40) * GI}
            )
        if rng.random() < 0.2:
            capability = Resources({"cpu": rng.randint(50, 400) * 1000})
        specs.append(
            QueueSpec(
                name=name,
                weight=rng.choice((1, 1, 1, 2, 2, 3, 4)),
                guarantee=guarantee,
                capability=capability,
                blocking=rng.random() < 0.1,
                policy="FIFO" if rng.random() < 0.3 else "Priority",
            )
        )
    return capacity, specs, pending


def with_nodes(
    specs: list[QueueSpec], units: list[Unit], nodes: int, fill: float, seed: int
) -> tuple[Resources, list[QueueSpec], list[Unit], list[Node], list[Pool]]:
    """The workload on `nodes` nodes: units split into pods, queues given pools."""
    rng = random.Random(seed)
    split: list[Unit] = []
    total: dict[str, int] = {}
    for unit in units:
        count = max(1, unit.demand.get_amount("pods"))
        per_pod = Resources({r: -(-v // count) for r, v in unit.demand.items() if r != "pods"})
        per_pod = per_pod + {"pods": 1}
        demand = per_pod.scale(count)
        split.append(Unit(unit.key, unit.queue, demand, unit.priority, unit.created,
                          (PodSet("main", count, per_pod),)))
        for r, v in demand.items():
            total[r] = total.get(r, 0) + v
    gpu_nodes = max(1, nodes // 5)
    gpus = -(-int(total.get(GPU, 0) * fill) // gpu_nodes)
    size = {r: int(v * fill) // nodes + 1 for r, v in total.items() if r != GPU}
    node_list = []
    for i in range(nodes):
        allocatable = dict(size)
        labels = {"zone": "abc"[i % 3]}
        if i < gpu_nodes:
            allocatable[GPU] = gpus
            labels["accel"] = "gpu"
        node_list.append(Node(f"node-{i:05d}", labels, Resources(allocatable)))
    capacity = EMPTY
    for node in node_list:
        capacity = capacity + node.allocatable
    gpu_queues = {u.queue for u in split if u.demand.get_amount(GPU)}
    placed = []
    for spec in specs:
        pools: tuple[str, ...] = ()
        if spec.name in gpu_queues:
            pools = ("gpu",)
        elif rng.random() < 0.7:
            pools = ("default",)
        selector = {"zone": rng.choice("abc")} if rng.random() < 0.1 else {}
        placed.append(QueueSpec(spec.name, spec.weight, spec.guarantee, spec.capability,
                                spec.blocking, spec.policy, pools, selector))
    return capacity, placed, split, node_list, [Pool("gpu", {"accel": "gpu"})]


def verdict(value: float, budget: float) -> str:
    return "PASS" if value <= budget else "OVER"


def budget_row(label: str, value: str, budget: str, passed: str) -> None:
    """One measured row against its DESIGN §9 budget."""
    print(f"  {label:<44} {value:>12}   budget {budget:>8}   {passed}")


def load() -> str:
    """`uptime`'s load averages: the machine is shared with other work."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def order_hash(engine: AdmissionEngine, admitted: list[Unit]) -> str:
    """A digest of the admission order and plans: an optimisation must not change it."""
    digest = hashlib.sha256()
    for unit in admitted:
        digest.update(unit.key.encode())
        plan = engine.plan(unit.key)
        if plan is not None:
            digest.update(repr((plan.pool, sorted(plan.nodes.items()))).encode())
    return digest.hexdigest()[:16]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


def clocks() -> tuple[float, float]:
    """(wall, CPU of this process): the machine may be shared with other work."""
    return time.perf_counter(), time.process_time()


def full_admission(
    capacity: Resources,
    specs: list[QueueSpec],
    units: list[Unit],
    repeat: int,
    nodes: list[Node] | None = None,
    pools: list[Pool] | None = None,
    budget: float = 1.0,
) -> tuple[AdmissionEngine, list[Unit]]:
    """Build a fresh engine and admit_all(), `repeat` times; report best and median."""
    runs: list[tuple[float, float, float]] = []  # build wall, admit wall, total CPU

    def once() -> tuple[AdmissionEngine, list[Unit]]:
        gc.collect()
        w0, c0 = clocks()
        engine = AdmissionEngine(capacity, specs, nodes, pools or ())
        add = engine.add_pending
        for unit in units:
            add(unit)
        w1, _ = clocks()
        admitted = engine.admit_all()
        w2, c2 = clocks()
        runs.append((w1 - w0, w2 - w1, c2 - c0))
        return engine, admitted

    for _ in range(repeat - 1):
        once()  # dropped before the next run starts
    result = once()
    n = len(result[1])

    def row(label: str, values: list[float]) -> None:
        best, median = ms(min(values)), ms(statistics.median(values))
        print(f"  {label:<22} best {best:>10}   median {median:>10}")

    print(f"\nfull admission, {repeat} runs (budget <= {budget:g} s)")
    print(f"  admitted {n} of {len(units)} units ({n / len(units):.0%}); "
          f"order hash {order_hash(result[0], result[1])}")
    row("build, wall", [r[0] for r in runs])
    row("admit_all, wall", [r[1] for r in runs])
    row("total, wall", [r[0] + r[1] for r in runs])
    row("total, CPU", [r[2] for r in runs])
    best = min(min(r[0] + r[1] for r in runs), min(r[2] for r in runs))
    print(f"  per admitted unit      {us(best / max(n, 1))} (best total / admitted)")
    budget_row(f"full pass, best of {repeat} (wall or CPU)", ms(best), f"{budget:g} s",
               verdict(best, budget))
    return result


def incremental(
    engine: AdmissionEngine, admitted: list[Unit], seed: int, rounds: int, budget: float = 1.0
) -> None:
    """Release admitted units, then time next() until nothing more fits."""
    rng = random.Random(seed)
    live = [u.key for u in admitted]
    order: list[Unit] = []  # everything admitted here, for the order hash

    def release(count: int) -> tuple[float, float]:
        w0, c0 = clocks()
        for _ in range(count):
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            engine.release(live.pop())
        w1, c1 = clocks()
        return w1 - w0, c1 - c0

    def drain() -> tuple[list[float], float, int]:
        calls: list[float] = []
        got = 0
        c0 = time.process_time()
        while True:
            start = time.perf_counter()
            unit = engine.next()
            calls.append(time.perf_counter() - start)
            if unit is None:
                return calls, time.process_time() - c0, got
            got += 1
            live.append(unit.key)
            order.append(unit)

    print(f"\nincremental (budget <= {budget:g} ms per admitted unit; {load()})")
    batch = max(1, len(live) // 100)
    wall, cpu = release(batch)
    calls, drain_cpu, got = drain()
    print(f"  (a) release {batch} admitted units ({ms(wall)}), then next() until None:")
    print(
        f"      {got} admitted in {len(calls)} calls: per admitted unit "
        f"{us(sum(calls) / max(got, 1))} wall, {us(drain_cpu / max(got, 1))} CPU; "
        f"per call p99 {us(percentile(calls, 99))}, max {us(max(calls))}"
    )
    batch_unit = min(sum(calls), drain_cpu) / max(got, 1)
    budget_row("(a) per admitted unit after a 1 % release", us(batch_unit), f"{budget:g} ms",
               verdict(batch_unit * 1e3, budget))

    per_unit: list[float] = []
    per_unit_cpu: list[float] = []
    all_calls: list[float] = []
    for _ in range(rounds):
        wall, cpu = release(1)
        calls, drain_cpu, got = drain()
        all_calls.extend(calls)
        if got:
            per_unit.append((wall + sum(calls)) / got)
            per_unit_cpu.append((cpu + drain_cpu) / got)
    print(
        f"  (b) {rounds} rounds of: release one unit, next() until None "
        f"({len(per_unit)} rounds admitted something)"
    )
    if per_unit:
        print(
            f"      per admitted unit, release + all calls: mean {us(statistics.fmean(per_unit))}, "
            f"p99 {us(percentile(per_unit, 99))}, max {us(max(per_unit))} wall; "
            f"mean {us(statistics.fmean(per_unit_cpu))} CPU"
        )
        p99_wall = percentile(per_unit, 99)
        p99_cpu = percentile(per_unit_cpu, 99)
        budget_row("(b) p99 per admitted unit, wall", us(p99_wall), f"{budget:g} ms",
                   verdict(p99_wall * 1e3, budget))
        budget_row("(b) p99 per admitted unit, CPU", us(p99_cpu), f"{budget:g} ms",
                   verdict(p99_cpu * 1e3, budget))
    print(
        f"      per next() call: mean {us(statistics.fmean(all_calls))}, "
        f"p99 {us(percentile(all_calls, 99))}"
    )
    print(f"  incremental order hash {order_hash(engine, order)}")


def deserved_time(capacity: Resources, specs: list[QueueSpec], units: list[Unit]) -> None:
    totals: dict[str, dict[str, int]] = {}
    for unit in units:
        bucket = totals.setdefault(unit.queue, {})
        for r, v in unit.demand.items():
            bucket[r] = bucket.get(r, 0) + v
    demand = {q: Resources(v) for q, v in totals.items()}
    w0, c0 = clocks()
    shares = deserved(capacity, specs, demand)
    w1, c1 = clocks()
    print(f"\ndeserved() over {len(shares)} queues: {ms(w1 - w0)} wall, {ms(c1 - c0)} CPU")


def tree_admission(capacity: Resources, specs: list[QueueSpec], units: list[Unit],
                   repeat: int, seed: int) -> None:
    """The same queues as leaves of a 3-level tree (10 orgs x 10 departments x
    10 leaves each, DESIGN §11): full admission by the hierarchical engine,
    against a flat full pass of the same units (target <= 1.5x)."""
    rng = random.Random(seed)
    orgs = [QueueSpec(f"org-{i}", weight=rng.choice((1, 2))) for i in range(10)]
    depts = [QueueSpec(f"dept-{i}", parent=f"org-{i % 10}", weight=rng.choice((1, 2, 3)),
                       capability=Resources({"cpu": rng.randint(100, 800) * 1000})
                       if rng.random() < 0.2 else EMPTY)
             for i in range(100)]
    tree = [*orgs, *depts,
            *(dataclasses.replace(spec, parent=f"dept-{k % 100}") for k, spec in enumerate(specs))]

    def timed(make: Callable[[], AdmissionEngine | HierarchicalEngine]) -> tuple[float, int]:
        best, n = float("inf"), 0
        for _ in range(repeat):
            gc.collect()
            _, c0 = clocks()
            engine = make()
            for unit in units:
                engine.add_pending(unit)
            n = len(engine.admit_all())
            _, c1 = clocks()
            best = min(best, c1 - c0)
        return best, n

    flat, flat_n = timed(lambda: AdmissionEngine(capacity, specs))
    hier, hier_n = timed(lambda: HierarchicalEngine(capacity, tree))
    print(f"\nhierarchical (3 levels, {len(specs)} leaves), full admission, CPU, best of {repeat}")
    print(f"  flat                   {ms(flat):>10}   admitted {flat_n}")
    print(f"  tree                   {ms(hier):>10}   admitted {hier_n}")
    print(f"  -> {hier / flat:.2f}x flat, target <= 1.5x: {verdict(hier, 1.5 * flat)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fill", type=float, default=0.6)
    parser.add_argument("--repeat", type=int, default=3, help="full-admission repetitions")
    parser.add_argument("--rounds", type=int, default=500, help="steady-state release rounds")
    parser.add_argument("--nodes", type=int, default=0, help="node fit on this many nodes")
    args = parser.parse_args(argv)

    print(f"machine: {cpu_model()}, {os.cpu_count()} logical cores")
    print(f"python:  {platform.python_implementation()} {platform.python_version()}")
    print(f"at start: {load()} (other work on the machine)")
    capacity, specs, units = build_workload(args.queues, args.units, args.seed, args.fill)
    print(
        f"workload: {len(specs)} queues, {len(units)} pending units, "
        f"capacity {capacity.to_quantities()} ({args.fill:.0%} of total demand)"
    )
    if args.nodes:
        capacity, specs, units, nodes, pools = with_nodes(
            specs, units, args.nodes, args.fill, args.seed)
        print(f"nodes:    {len(nodes)} ({sum(1 for n in nodes if GPU in n.allocatable)} in "
              f"pool gpu), capacity {capacity.to_quantities()}")
        engine, admitted = full_admission(capacity, specs, units, args.repeat, nodes, pools, 2.0)
        incremental(engine, admitted, args.seed + 1, args.rounds, 2.0)
    else:
        engine, admitted = full_admission(capacity, specs, units, args.repeat)
        incremental(engine, admitted, args.seed + 1, args.rounds)
        deserved_time(capacity, specs, units)
        tree_admission(capacity, specs, units, args.repeat, args.seed)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak RSS: {peak / 1024:.1f} MiB")
    print(f"at end: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
