"""Benchmark: a status pass with units naming many resources (issue #25 row 9).

A tenant's units may name up to 16 resources each (the webhook's default
`--max-resource-names`); a hostile tenant makes them all distinct names
the cluster has none of. This builds a synced cache with 20 nodes (cpu,
memory and `--names` - 2 extended resources), 10 queues and `--units`
QueueUnits: half admitted, naming all the nodes' resources, half waiting,
naming cpu, memory and `--names` - 2 made-up resources of their own, then
times one status pass as the loop and the debug API run it: `deserved()`
and `queue_views()` (which computes deserved again, plus each queue's
allocation and share). Printed: the best and median of `--repeat` runs, and
how many distinct resource names the units name.

    .venv/bin/python bench/bench_status_names.py [--units 1000] [--names 16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arbiter.cache.store import KINDS, ClusterStore
from arbiter.loop.follow import mirror_from_store
from arbiter.loop.status import queue_views
from tests.extender import builders as b

QUEUES = 10
NODES = 20


def build_store(units: int, names: int) -> ClusterStore:
    store = ClusterStore()
    for index in range(NODES):
        node = b.node(f"node-{index}", cpu="32", memory="128Gi")
        extended = {f"example.com/r-{k}": "1000" for k in range(names - 2)}
        node["status"]["allocatable"] = {**node["status"]["allocatable"], **extended}
        store.apply("Node", "ADDED", node)
    for index in range(QUEUES):
        store.apply("Queue", "ADDED", b.queue(f"q-{index}", weight=1 + index % 3))
    for index in range(units):
        running = index % 2 == 1
        obj = b.unit(f"ns-{index % QUEUES}", f"u-{index}", f"q-{index % QUEUES}",
                     phase="Running" if running else "Enqueued")
        requests = {"cpu": "100m", "memory": "128Mi"}
        # Admitted units name what the nodes have (a unit naming a resource
        # the cluster has none of never fits, so it is never admitted).
        requests.update({f"example.com/r-{k}" if running else f"example.com/r-{index}-{k}": "1"
                         for k in range(names - 2)})
        obj["spec"]["podSets"][0]["requests"] = requests
        store.apply("QueueUnit", "ADDED", obj)
    store.synced_kinds.update(KINDS)
    return store


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--names", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    store = build_store(args.units, args.names)
    mirror = mirror_from_store(store)
    distinct = {name for unit in store.units.values() for ps in unit.pod_sets
                for name in ps.requests}
    timings: dict[str, list[float]] = {"deserved()": [], "queue_views()": []}
    for _ in range(args.repeat):
        started = time.perf_counter()
        mirror.deserved()
        timings["deserved()"].append(time.perf_counter() - started)
        started = time.perf_counter()
        views = queue_views(mirror)
        timings["queue_views()"].append(time.perf_counter() - started)
    print(f"{args.units} units x {args.names} resource names ({len(distinct)} distinct in all), "
          f"{QUEUES} queues, {NODES} nodes; {len(views)} queue views")
    worst = 0.0
    for what, samples in timings.items():
        median = statistics.median(samples)
        worst = max(worst, median)
        print(f"  {what:15} best {min(samples) * 1e3:7.1f} ms   median {median * 1e3:7.1f} ms")
    print(f"status pass (median): {worst * 1e3:.1f} ms (goal < 50 ms each)")
    return 0 if worst < 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
