"""Benchmark: reclaim — how fast DRF shares come back when a tenant arrives.

Offline (default): victim selection at scale, no I/O.
1. `plan()` alone: `--queues` queues, queue 0 holding the whole cluster
   with `--units` one-CPU units, `--arrivals` queues arriving with as many
   waiting; one pass picks up to 100 victims (the per-look cap);
2. a whole look of the loop (`Reclaimer.look` on an EngineMirror: deserved
   shares, the admitted units, the pass).

On a sandbox of its own (`--sandbox`): `--nodes` fake nodes × 1 CPU (500
by default), `--queues` queues (10), arbiter started with
`--reclaim-grace`; queue 0 fills the cluster with one long-running pod per
CPU, then `--arrivals` queues (1) submit as many pods each (held back by
a capability of 1m while they are created, then let in at once). Printed:
the time from their arrival until every tenant runs its DRF share
(nodes / (arrivals + 1) pods each, as the pods' phases say), with the grace
period included and without it.

    .venv/bin/python bench/bench_reclaim.py [--units 100000]
    .venv/bin/python bench/bench_reclaim.py --sandbox [--nodes 500 --grace 5 --keep DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arbiter.cache.records import QueueRecord
from arbiter.core.deserved import deserved
from arbiter.core.engine.flat import AdmissionEngine
from arbiter.core.model import Node, QueueSpec, Unit
from arbiter.core.reclaim.flat import Admitted, ReclaimQueue, Waiting, plan
from arbiter.core.reclaim.room import NodeRoom
from arbiter.core.resources import Resources
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.reclaim import Reclaimer, ReclaimSettings

CPU = Resources({"cpu": 1000})


def offline(units: int, queues: int, arrivals: int, repeat: int) -> None:
    names = [f"q{i:02d}" for i in range(queues)]
    capacity = Resources({"cpu": units * 1000})
    demand = {name: Resources() for name in names}
    demand[names[0]] = CPU.scale(units)
    for name in names[1: 1 + arrivals]:
        demand[name] = CPU.scale(units)
    started = time.perf_counter()
    shares = deserved(capacity, [QueueSpec(n) for n in names], demand)
    took_deserved = time.perf_counter() - started
    specs = {n: ReclaimQueue(n, deserved=shares[n]) for n in names}
    admitted = [Admitted(f"{names[0]}/u{i:06d}", names[0], CPU, 0, float(i), float(i))
                for i in range(units)]
    waiting = {n: [Waiting(f"{n}/w{i:06d}", n, CPU) for i in range(256)]
               for n in names[1: 1 + arrivals]}
    times = []
    victims = 0
    for _ in range(repeat):
        started = time.perf_counter()
        result = plan(capacity, specs, admitted, waiting, due=set(waiting))
        times.append(time.perf_counter() - started)
        victims = len(result.victims)
    print(f"deserved(): {queues} queues: {took_deserved * 1e3:.2f} ms")
    print(f"plan(): {units:,} admitted units, {arrivals} arriving queue(s): "
          f"{victims} victims in p50 {statistics.median(times) * 1e3:.1f} ms "
          f"(max {max(times) * 1e3:.1f} ms)")

    mirror = EngineMirror()
    mirror.set_queues({n: QueueRecord(n) for n in names})
    mirror.set_capacity(capacity)
    for unit in admitted:
        mirror.set(unit.key, "admitted", Unit(unit.key, unit.queue, CPU, created=unit.created))
    for name in names[1: 1 + arrivals]:
        for i in range(units):
            key = f"{name}/w{i:06d}"
            mirror.set(key, "pending", Unit(key, name, CPU, created=float(units + i)))
    looks = []
    for attempt in range(repeat):
        reclaimer = Reclaimer(ReclaimSettings(grace=0.0))
        reclaimer.since = {n: 0.0 for n in names[1: 1 + arrivals]}
        started = time.perf_counter()
        look = reclaimer.look(mirror, 100.0 + attempt)
        looks.append(time.perf_counter() - started)
        victims = len(look.victims)
    print(f"Reclaimer.look(): {units:,} admitted + {arrivals * units:,} waiting: "
          f"{victims} victims in p50 {statistics.median(looks) * 1e3:.1f} ms "
          f"(max {max(looks) * 1e3:.1f} ms)")


def offline_nodes(units: int, nodes: int, arrivals: int, repeat: int) -> None:
    """plan() with node fit (DESIGN §10): queue 0's one-CPU units planned on
    `nodes` equal nodes that they fill; the arriving queues' units need two
    CPUs on one node, so each victim pair must share a node. Victims in two
    orders, each cut to the loop's 4,096 candidates: (a) newest first (the
    last nodes' units: victims in a row share a node); (b) round-robin over
    blocks of 1,000 nodes (unit j of each node of a block, then unit j + 1:
    victims in a row never share a node, so a set is found node by node).
    Each also without the room (total free room only) for comparison; the
    engine itself then says how many served units would start."""
    names = ["q00", *(f"q{i:02d}" for i in range(1, 1 + arrivals))]
    per_node = max(2, -(-units // nodes))
    capacity = Resources({"cpu": per_node * 1000 * nodes})
    queues = {n: ReclaimQueue(n) for n in names}
    orders: dict[str, Callable[[Admitted], tuple[float, ...]]] = {
        "newest first": lambda u: (-u.created,),
        "round-robin": lambda u: (int(u.created) // per_node // 1000,
                                  int(u.created) % per_node, int(u.created) // per_node),
    }
    for order, key in orders.items():
        for label, room in (("without node fit", False), ("with node fit", True)):
            engine = AdmissionEngine(capacity, [QueueSpec(n) for n in names], [
                Node(f"node-{i:05d}", {}, Resources({"cpu": per_node * 1000}))
                for i in range(nodes)])
            for i in range(per_node * nodes):
                engine.add_pending(Unit(f"q00/u{i:06d}", "q00", CPU, created=float(i)))
            engine.admit_all()
            admitted = sorted((Admitted(u.key, u.queue, u.demand, 0, u.created, u.created)
                               for u in engine.admitted("q00")), key=key)[:4096]
            for name in names[1:]:
                for i in range(256):
                    engine.add_pending(Unit(f"{name}/w{i:06d}", name, CPU.scale(2),
                                            created=float(units + i)))
            waiting = {name: [Waiting(u.key, u.queue, u.demand) for u in engine.pending(name)]
                       for name in names[1:]}
            pending = {u.key: u for name in names[1:] for u in engine.pending(name)}
            view = engine.node_view()
            assert view is not None
            times = []
            result = None
            for _ in range(repeat):
                started = time.perf_counter()
                result = plan(capacity, queues, admitted, waiting, due=set(waiting),
                              ordered=True, allocated={"q00": capacity},
                              room=NodeRoom(view, pending, capacity) if room else None)
                times.append(time.perf_counter() - started)
            assert result is not None
            print(f"plan() {label}, victims {order}: {per_node * nodes:,} admitted on "
                  f"{nodes:,} nodes, {arrivals} arriving queue(s): {len(result.victims)} "
                  f"victims for {len(result.served)} units, {placeable(engine, result)} of "
                  f"which start; p50 {statistics.median(times) * 1e3:.1f} ms "
                  f"(max {max(times) * 1e3:.1f} ms)")


def placeable(engine: AdmissionEngine, result: Any) -> int:
    """How many served units start once their victims are gone, by the engine
    itself (it releases the victims, then admits what it can)."""
    served = 0
    released: set[str] = set()
    for key in result.served:
        for victim in result.victims:
            if victim.for_unit == key and victim.unit.key not in released:
                engine.release(victim.unit.key)
                released.add(victim.unit.key)
    while engine.next() is not None:
        served += 1
    return served


# -- on a sandbox --------------------------------------------------------------------


def sandbox_run(nodes: int, queues: int, arrivals: int, grace: float, keep: Path | None,
                timeout: float) -> None:
    from arbiter.sandbox import NodeShape, Sandbox

    directory = keep or Path(tempfile.mkdtemp(prefix="bench-reclaim-"))
    sandbox = Sandbox(directory)
    started = time.monotonic()
    sandbox.up(NodeShape(count=nodes, cpu="1", memory="8Gi"), timeout=600.0)
    print(f"sandbox with {nodes} nodes up in {time.monotonic() - started:.0f}s ({directory})")
    try:
        sandbox.stop_arbiter()
        sandbox.start_arbiter(["--reclaim-grace", str(grace)])
        names = [f"tenant-{i:02d}" for i in range(queues)]
        items: list[dict[str, Any]] = []
        for name in names:
            items.append({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": name}})
            items.append({"apiVersion": "arbiter.dev/v1alpha1", "kind": "Queue",
                          "metadata": {"name": name}, "spec": {"namespaces": [name]}})
        _create(sandbox, items)
        time.sleep(2.0)  # the webhook resolves queues from its cache
        _create(sandbox, [_pod(f"p{i:04d}", names[0]) for i in range(nodes)])
        _wait(f"{names[0]} runs {nodes} pods",
              lambda: _running(sandbox, names[0]) >= nodes, timeout)
        arriving = names[1: 1 + arrivals]
        share = nodes // (arrivals + 1)
        # The newcomers' pods are created behind a capability of 1m (a queue at
        # its capability does not starve), then the capability is lifted: all
        # of them arrive at once, however long creating them took.
        for name in arriving:
            sandbox.kubectl("patch", "queue", name, "--type=merge", "-p",
                            json.dumps({"spec": {"capability": {"cpu": "1m"}}}))
        time.sleep(2.0)
        begun = time.monotonic()
        for name in arriving:
            _create(sandbox, [_pod(f"p{i:04d}", name) for i in range(nodes)])
        created = time.monotonic() - begun
        _wait("every unit known to arbiter", lambda: _units(sandbox, arriving) >= nodes
              * arrivals, timeout)
        submitted = time.monotonic()
        for name in arriving:
            sandbox.kubectl("patch", "queue", name, "--type=json", "-p",
                            json.dumps([{"op": "remove", "path": "/spec/capability"}]))
        last: dict[str, int] = {}

        def converged() -> bool:
            last.update({n: _running(sandbox, n) for n in [names[0], *arriving]})
            return all(last[n] >= share for n in arriving) and last[names[0]] <= nodes - \
                share * arrivals

        _wait("DRF shares", converged, timeout, progress=last)
        took = time.monotonic() - submitted
        print(f"{arrivals} tenant(s) arrived with {nodes} pods each (created in "
              f"{created:.1f}s, then let in at once); DRF shares ({share} pods each) "
              f"reached {took:.1f}s after arrival: {took - grace:.1f}s beyond the "
              f"{grace:g}s grace; running: {json.dumps(last)}")
    finally:
        if keep is None:
            sandbox.down()
        else:
            print(f"left running: arbiter sandbox down --dir {directory}")


def _pod(name: str, ns: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}]}}


def _create(sandbox: Any, items: list[dict[str, Any]], chunk: int = 250) -> None:
    for start in range(0, len(items), chunk):
        sandbox.kubectl("create", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": items[start:start + chunk]}))


def _running(sandbox: Any, ns: str) -> int:
    out = sandbox.kubectl("get", "pods", "-n", ns, "--no-headers", "-o",
                          "custom-columns=P:.status.phase,D:.metadata.deletionTimestamp").stdout
    return sum(1 for line in out.splitlines()
               if line.split()[:2] == ["Running", "<none>"])


def _units(sandbox: Any, namespaces: list[str]) -> int:
    return sum(len(sandbox.kubectl("get", "queueunits", "-n", ns, "--no-headers",
                                   "-o", "name").stdout.split()) for ns in namespaces)


def _wait(what: str, check: Any, timeout: float, progress: dict[str, int] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}: {progress or ''}")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--units", type=int, default=100_000, help="offline: admitted units")
    parser.add_argument("--repeat", type=int, default=5, help="offline: timed runs")
    parser.add_argument("--queues", type=int, default=10)
    parser.add_argument("--arrivals", type=int, default=1,
                        help="queues that arrive after queue 0 filled the cluster")
    parser.add_argument("--sandbox", action="store_true",
                        help="measure convergence on a sandbox of its own")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--offline-nodes", type=int, default=0,
                        help="offline: also plan() with node fit on this many nodes")
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--keep", type=Path, help="sandbox directory to use and leave running")
    args = parser.parse_args(argv)
    if args.sandbox:
        sandbox_run(args.nodes, args.queues, args.arrivals, args.grace, args.keep, args.timeout)
    else:
        offline(args.units, args.queues, args.arrivals, args.repeat)
        if args.offline_nodes:
            offline_nodes(args.units, args.offline_nodes, args.arrivals, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
