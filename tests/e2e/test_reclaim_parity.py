"""Issue 26 on the real control plane (10 fake nodes x 1 CPU): the cluster
reaches what the offline engine says.

* The issue's case, with the DEFAULT 30 s grace: `heavy` (weight 5) runs
  ten 1-CPU Jobs, then `light` (weight 1, guarantee 3 CPU) submits six.
  `arbiter fairshare` (heavy's ten as `running:`) says 7/3; the cluster gets
  there within 60 s of light's arrival and stays (OBSERVE seconds: 30 by
  default, ARBITER_E2E_PARITY_OBSERVE=120 gives the issue's two minutes).
* Four seeded scenarios with a 5 s grace (two flat, one of them with a
  Pool; two trees): a first wave fills the cluster, a second, in the seed's
  order, needs reclaim. Each ends where the offline engine
  (`arbiter.cli.fairshare_reclaim.fixpoint`, what `arbiter fairshare` runs
  from `running:` units) puts it, within 90 s of the last arrival. With
  the Pool, where units run may matter (which hold the pool's nodes, and
  which of those are taken first): the engine starts from the cluster's
  real state, each running unit on the node its pod was bound to
  (kube-scheduler's choice, not first fit), in the loop's admission
  order; and the scenario is one whose move rule stops at one split only.
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from arbiter.cli.fairshare_reclaim import fixpoint, take_running
from arbiter.cli.fairshare_scenario import load_scenario
from arbiter.core.api import job_unit_name
from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    CPUS,
    arbiter_with,
    create,
    queue,
    run_arbiter,
    scenario,
    suffix,
    wait_for,
)
from tests.e2e.test_placement import NODES, admitted, labelled, long_job, pods_of, pool_object
from tests.e2e.test_reclaim_fair import unsuspended

ISSUE_WITHIN = 60.0
SCENARIO_WITHIN = 90.0
OBSERVE = float(os.environ.get("ARBITER_E2E_PARITY_OBSERVE", "30"))
HOLD = 5.0  # a scenario's split must hold this long once reached
GRACE = 5.0  # for the seeded scenarios


def split(sandbox: Sandbox, leaves: list[str]) -> dict[str, int]:
    return {name: unsuspended(sandbox, name) for name in leaves}


def arrive(sandbox: Sandbox, jobs: list[tuple[str, str]], tag: str) -> None:
    create(sandbox, *(long_job(f"j{index:02d}-{tag}", ns, cpu=cpu)
                      for index, (ns, cpu) in enumerate(jobs)))


def test_the_issue_settles_at_the_guarantee_and_stays(sandbox: Sandbox,
                                                      tmp_path: Path) -> None:
    tag = suffix()
    heavy, light = f"heavy-{tag}", f"light-{tag}"
    document = {"capacity": {"cpu": str(CPUS)}, "queues": [
        {"name": heavy, "weight": 5, "running": [{"count": CPUS, "requests": {"cpu": "1"}}]},
        {"name": light, "weight": 1, "guarantee": {"cpu": "3"},
         "units": [{"count": 6, "requests": {"cpu": "1"}}]}]}
    path = tmp_path / "issue.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    out = json.loads(run_arbiter("fairshare", str(path), check=True).stdout)["queues"]
    expected = {heavy: int(out[heavy]["admitted"]), light: int(out[light]["admitted"])}
    assert expected == {heavy: 7, light: 3}
    with scenario(sandbox, {heavy: {"namespaces": [heavy], "weight": 5},
                            light: {"namespaces": [light], "weight": 1,
                                    "guarantee": {"cpu": "3"}}}, [heavy, light]):
        arrive(sandbox, [(heavy, "1")] * CPUS, "h")
        wait_for("heavy runs everything", lambda: unsuspended(sandbox, heavy) == CPUS,
                 timeout=60)
        arrive(sandbox, [(light, "1")] * 6, "l")
        arrived = time.monotonic()
        wait_for("7/3", lambda: split(sandbox, [heavy, light]) == expected,
                 timeout=ISSUE_WITHIN, poll=1.0)
        took = time.monotonic() - arrived
        until = time.monotonic() + OBSERVE
        while time.monotonic() < until:
            assert split(sandbox, [heavy, light]) == expected
            time.sleep(3.0)
        print(f"issue case: 7/3 {took:.1f}s after light's arrival (default grace), "
              f"held {OBSERVE:.0f}s")


# -- seeded scenarios ---------------------------------------------------------------------

Spec = dict[str, dict[str, Any]]  # leaf or parent name -> Queue spec (without namespaces)


def scenarios(tag: str) -> list[tuple[str, Spec, list[tuple[str, str]], list[tuple[str, str]]]]:
    """(name, queues, first wave, second wave before shuffling): parents
    first, leaves named as their namespaces; cpu per Job."""
    a, b, c = (f"{x}-{tag}" for x in "abc")
    p, p1, p2, q = (f"{x}-{tag}" for x in ("p", "p1", "p2", "q"))
    return [
        ("flat 3:2:1, a guarantee", {a: {"weight": 3}, b: {"weight": 2,
                                                           "guarantee": {"cpu": "2"}},
                                     c: {"weight": 1}},
         [(a, "1")] * 10, [(b, "1")] * 6 + [(c, "1")] * 6),
        # c's weight 3, not 2: with 2, b and c tie at a weighted share of 1/5
        # and the move rule stops at any of 3/3/4, 3/2/5 and 2/3/5 (which
        # one: where the victims' pods were bound, kube-scheduler's choice);
        # with 3 only at 2/2/6, wherever the pods run.
        ("flat, a queue confined to a pool", {
            a: {"weight": 1}, b: {"weight": 1, "pools": [f"pool-{tag}"],
                                  "guarantee": {"cpu": "1"}},
            c: {"weight": 3}},
         [(a, "1")] * 10, [(b, "1")] * 3 + [(c, "1")] * 6),
        ("tree, siblings 1:3 next to a queue", {
            p: {"weight": 1}, p1: {"parent": p, "weight": 1}, p2: {"parent": p, "weight": 3},
            q: {"weight": 1}},
         [(q, "1")] * 10, [(p1, "1")] * 6 + [(p2, "1")] * 6),
        ("tree, a child under its guarantee", {
            p: {"weight": 1}, p1: {"parent": p, "guarantee": {"cpu": "3"}},
            p2: {"parent": p}, q: {"weight": 5}},
         [(p2, "1")] * 4 + [(q, "1")] * 6, [(q, "1")] * 4 + [(p1, "1")] * 6),
    ]


Running = dict[str, list[dict[str, Any]]]  # leaf -> `running:` entries


def offline(queues: Spec, first: list[tuple[str, str]] | Running,
            second: list[tuple[str, str]], pool: tuple[str, list[str]] | None) -> dict[str, int]:
    """The offline engine from the same state: the first wave running (it
    fits; or as `read_running` found it), the second arriving in the same
    order, settled."""
    def units(wave: list[tuple[str, str]], name: str) -> list[dict[str, Any]]:
        return [{"requests": {"cpu": cpu}} for ns, cpu in wave if ns == name]

    def started(name: str) -> list[dict[str, Any]]:
        return first.get(name, []) if isinstance(first, dict) else units(first, name)

    nodes = [{"name": node, "allocatable": {"cpu": "1", "memory": "8Gi", "pods": "110"},
              **({"labels": {"arbiter-test-pool": "yes"}} if pool and node in pool[1] else {})}
             for node in NODES]
    # Nodes matter only for the pool (1-CPU Jobs on 1-CPU nodes: the
    # aggregate is node fit); a tree is evaluated on aggregate capacity.
    where: dict[str, Any] = {"nodes": nodes} if pool else {"capacity": {"cpu": str(CPUS)}}
    document: dict[str, Any] = {**where, "queues": [
        {"name": name, **spec, **({"running": started(name), "units": units(second, name)}
                                  if "parent" in spec or name not in _parents(queues) else {})}
        for name, spec in queues.items()]}
    if pool is not None:
        document["pools"] = [{"name": pool[0], "nodeSelector": {"arbiter-test-pool": "yes"}}]
    for entry in document["queues"]:
        for field in ("running", "units"):
            if field in entry and not entry[field]:
                del entry[field]
    running = take_running(document)
    simulation, _ = fixpoint(load_scenario(document), running)
    assert simulation.converged
    return {name: count for name, count in simulation.counts().items()
            if name not in _parents(queues)}


def read_running(sandbox: Sandbox, leaves: list[str]) -> Running | None:
    """Each leaf's admitted Jobs as `running:` entries, each with the node
    its pod is bound to, oldest admission first as the loop's victim order
    reads them (lastAllocateTime, then creation, then the key, newest
    first): None while a pod is not bound yet."""
    rows: list[tuple[str, str, str, str, dict[str, Any]]] = []
    for ns in leaves:
        nodes: dict[str, str] = {}
        for pod in pods_of(sandbox, ns):
            for ref in pod["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "Job" and pod["spec"].get("nodeName"):
                    nodes[job_unit_name(ref["name"])] = pod["spec"]["nodeName"]
        for unit in admitted(sandbox, ns):
            name = unit["metadata"]["name"]
            if name not in nodes:
                return None
            cpu = unit["status"]["allocated"]["cpu"]
            rows.append((unit["status"]["lastAllocateTime"],
                         unit["metadata"]["creationTimestamp"], ns, f"{ns}/{name}",
                         {"name": name, "requests": {"cpu": cpu}, "nodes": [nodes[name]]}))
    rows.sort(key=lambda row: row[3], reverse=True)  # the key breaks ties, smallest last
    rows.sort(key=lambda row: row[:2])  # (stable) newest last
    found: Running = {}
    for *_, ns, _, entry in rows:
        found.setdefault(ns, []).append(entry)
    return found


def _parents(queues: Spec) -> set[str]:
    return {str(spec["parent"]) for spec in queues.values() if "parent" in spec}


@pytest.fixture(scope="module")
def short_grace(sandbox: Sandbox) -> Iterator[None]:
    with arbiter_with(sandbox, ["--reclaim-grace", str(GRACE)]):
        yield


@contextmanager
def queues_of(sandbox: Sandbox, queues: Spec) -> Iterator[list[str]]:
    """Parents first (a child naming a missing parent is denied), leaves
    listing a namespace of their own name; parents deleted last."""
    parents = _parents(queues)
    leaves = [name for name in queues if name not in parents]
    if parents:
        create(sandbox, *(queue(name, **queues[name]) for name in parents))
    try:
        with scenario(sandbox, {name: {"namespaces": [name], **queues[name]} for name in leaves},
                      leaves):
            yield leaves
    finally:
        for name in parents:
            wait_for(f"queue {name} deleted", functools.partial(_deleted, sandbox, name),
                     timeout=60)


def _deleted(sandbox: Sandbox, name: str) -> bool:
    done = sandbox.kubectl("delete", "queue", name, "--ignore-not-found", check=False)
    return done.returncode == 0


@pytest.mark.parametrize("index", range(4))
def test_a_seeded_scenario_ends_where_the_engine_says(sandbox: Sandbox, short_grace: None,
                                                      index: int) -> None:
    tag = suffix()
    name, queues, first, second = scenarios(tag)[index]
    random.Random(26 + index).shuffle(second)
    pooled = "pools" in json.dumps(queues)
    pool = (f"pool-{tag}", NODES[-4:]) if pooled else None
    expected = offline(queues, first, second, pool) if pool is None else {}
    with ExitStack() as stack:
        if pool is not None:
            stack.enter_context(labelled(sandbox, pool[1], "arbiter-test-pool", "yes"))
            create(sandbox, pool_object(pool[0], {"arbiter-test-pool": "yes"}))
            stack.callback(sandbox.kubectl, "delete", "pool", pool[0], "--ignore-not-found",
                           check=False)
        leaves = stack.enter_context(queues_of(sandbox, queues))
        arrive(sandbox, first, "a")
        wait_for("the first wave runs", lambda: sum(split(sandbox, leaves).values()) == CPUS,
                 timeout=60)
        if pool is not None:
            running = wait_for("the first wave bound",
                               functools.partial(read_running, sandbox, leaves), timeout=60)
            expected = offline(queues, running, second, pool)
            print(f"{name}: the engine from the bound pods says {expected}, from first fit "
                  f"{offline(queues, first, second, pool)}")
        arrive(sandbox, second, "b")
        last = time.monotonic()
        seen: list[dict[str, int]] = []

        def reached() -> bool:
            seen.append(split(sandbox, leaves))
            return seen[-1] == expected

        try:
            wait_for(f"{name}: {expected}", reached, timeout=SCENARIO_WITHIN, poll=1.0)
        finally:
            print(f"{name}: splits seen {seen[-4:]}")
        took = time.monotonic() - last
        time.sleep(HOLD)
        assert split(sandbox, leaves) == expected
        print(f"{name}: {expected} {took:.1f}s after the last arrival (grace {GRACE:g}s)")
