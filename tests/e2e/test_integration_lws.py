"""LeaderWorkerSet queued group by group (issue 28, DESIGN §14) on the real
LWS controller: a unit per group (`lws-<name>-<index>`: the leader and
size - 1 workers), all or nothing: with room for one group, one runs whole
and the other waits wholly gated. On the `integrated` sandbox.
"""

from __future__ import annotations

import time
from typing import Any

from arbiter.sandbox import Sandbox
from tests.e2e.helpers import create, get, tenant, units, wait_for
from tests.e2e.workloads import (
    GROUP_INDEX,
    allocated_cpu,
    consumer,
    consumer_ref,
    gated,
    leaderworkerset,
    phase,
    pod_sets,
    pods,
    quiet,
    running,
    unit,
)


def by_group(found: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for pod in found:
        groups.setdefault(pod["metadata"]["labels"].get(GROUP_INDEX, "?"), []).append(pod)
    return groups


def test_with_room_for_one_group_one_runs_whole_and_the_other_waits_gated(
        integrated: Sandbox) -> None:
    sb = integrated
    quiet(sb)
    with tenant(sb, "lws", wait=60, capability={"cpu": "4"}) as (ns, q):
        create(sb, leaderworkerset("serve", ns, groups=2, size=3))
        created = get(sb, "leaderworkerset", "serve", "-n", ns)
        names = ["lws-serve-0", "lws-serve-1"]
        queued = wait_for("a unit per group", lambda: (
            found if None not in (found := [unit(sb, ns, name) for name in names]) else None))
        for group in queued:
            assert group is not None
            assert consumer_ref(group) == consumer(created)
            assert pod_sets(group) == {"leader": 1, "workers": 2}

        wait_for("one group's 3 pods Running", lambda: len(running(sb, ns)) == 3, timeout=90)
        time.sleep(3)  # time enough to let a pod of the other group go (wrongly)
        assert len(running(sb, ns)) == 3
        groups = by_group(pods(sb, ns))
        assert set(groups) <= {"0", "1"}, groups.keys()
        runs = [index for index, members in groups.items()
                if all(p["status"].get("phase") == "Running" for p in members)]
        assert len(runs) == 1 and len(groups[runs[0]]) == 3, groups
        assert not any(gated(p) for p in groups[runs[0]])
        waits = "1" if runs[0] == "0" else "0"
        # The other group: its leader at least exists, and every pod of it is gated.
        assert groups.get(waits), "the waiting group's leader was never made"
        assert all(gated(p) and p["status"].get("phase") != "Running" for p in groups[waits])
        phases = {u["metadata"]["name"]: phase(u) for u in units(sb, ns)}
        assert set(phases) == set(names)  # no unit per pod
        assert phases[f"lws-serve-{waits}"] == "Enqueued"
        assert phases[f"lws-serve-{runs[0]}"] in ("Dequeued", "Running")
        assert allocated_cpu(sb, q) == "3"
