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
* peak RSS.

Run: `.venv/bin/python -m bench.bench_engine` (or `python bench/bench_engine.py`).
Options: --queues N --units N --seed N --fill F (capacity / total demand).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import resource
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `arbiter` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arbiter.core.fairshare import AdmissionEngine, QueueSpec, Unit, deserved
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


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fill", type=float, default=0.6)
    parser.add_argument("--rounds", type=int, default=500, help="steady-state release rounds")
    parser.add_argument("--repeat", type=int, default=3, help="full-admission repetitions")
    args = parser.parse_args(argv)

    print(f"machine: {cpu_model()}, {os.cpu_count()} logical cores")
    print(f"python:  {platform.python_implementation()} {platform.python_version()}")
    capacity, specs, units = build_workload(args.queues, args.units, args.seed, args.fill)
    print(
        f"workload: {len(specs)} queues, {len(units)} pending units, "
        f"capacity {capacity.to_quantities()} ({args.fill:.0%} of total demand)"
    )

    # Full admission, repeated on fresh engines: wall and CPU time (the
    # machine may be shared; CPU time is what this process spent).
    runs: list[tuple[float, float, float, float]] = []
    engine = AdmissionEngine(capacity)
    admitted: list[Unit] = []
    for _ in range(args.repeat):
        del engine, admitted
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        engine = AdmissionEngine(capacity, specs)
        add = engine.add_pending
        for unit in units:
            add(unit)
        w1, c1 = time.perf_counter(), time.process_time()
        admitted = engine.admit_all()
        w2, c2 = time.perf_counter(), time.process_time()
        runs.append((w1 - w0, w2 - w1, c1 - c0, c2 - c1))
    n = len(admitted)

    def line(label: str, values: list[float]) -> str:
        return f"  {label:<29} best {ms(min(values)):>12}   median {ms(statistics.median(values)):>12}"

    print(f"\nfull admission, {args.repeat} runs (budget <= 1 s): {n} units admitted ({n / len(units):.0%})")
    print(line("build, wall", [r[0] for r in runs]))
    print(line("admit_all, wall", [r[1] for r in runs]))
    totals = [r[0] + r[1] for r in runs]
    print(line("total, wall", totals))
    cpu_totals = [r[2] + r[3] for r in runs]
    print(line("total, CPU", cpu_totals))
    best = min(min(totals), min(cpu_totals))
    print(f"  per admitted unit (best)      {us(best / max(n, 1))}")
    print(f"  -> {'OK' if best <= 1.0 else 'OVER BUDGET'}")

    rng = random.Random(args.seed + 1)
    live = [u.key for u in admitted]

    def release_some(count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            engine.release(live.pop())
        return time.perf_counter() - start

    def drain() -> tuple[list[float], int]:
        calls: list[float] = []
        got = 0
        while True:
            start = time.perf_counter()
            unit = engine.next()
            calls.append(time.perf_counter() - start)
            if unit is None:
                return calls, got
            got += 1
            live.append(unit.key)

    print("\nincremental (budget <= 1 ms per admitted unit)")
    batch = max(1, len(live) // 100)
    released = release_some(batch)
    calls, got = drain()
    spent = sum(calls)
    print(f"  (a) release {batch} units at once: release {ms(released)}, then {len(calls)} next() calls")
    print(
        f"      admitted {got}: {us(spent / max(got, 1))} per admitted unit; "
        f"next() mean {us(statistics.fmean(calls))}, p99 {us(percentile(calls, 99))}, "
        f"max {us(max(calls))}"
    )

    per_unit: list[float] = []
    all_calls: list[float] = []
    rounds_admitting = 0
    for _ in range(args.rounds):
        released = release_some(1)
        calls, got = drain()
        all_calls.extend(calls)
        if got:
            rounds_admitting += 1
            per_unit.append((released + sum(calls)) / got)
    print(
        f"  (b) {args.rounds} rounds of one release then next() until None "
        f"({rounds_admitting} rounds admitted something)"
    )
    if per_unit:
        print(
            f"      per admitted unit (release + all next() calls): mean {us(statistics.fmean(per_unit))}, "
            f"p99 {us(percentile(per_unit, 99))}, max {us(max(per_unit))}"
        )
    print(
        f"      next() call: mean {us(statistics.fmean(all_calls))}, p99 {us(percentile(all_calls, 99))}"
    )

    demand: dict[str, Resources] = {}
    totals: dict[str, dict[str, int]] = {}
    for unit in units:
        bucket = totals.setdefault(unit.queue, {})
        for r, v in unit.demand.items():
            bucket[r] = bucket.get(r, 0) + v
    demand = {q: Resources(v) for q, v in totals.items()}
    t3 = time.perf_counter()
    shares = deserved(capacity, specs, demand)
    t4 = time.perf_counter()
    print(f"\ndeserved() over {len(shares)} queues: {ms(t4 - t3)}")

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak RSS: {peak / 1024:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
