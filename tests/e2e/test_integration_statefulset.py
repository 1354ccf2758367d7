"""StatefulSet queued as one gang unit (issue 28, DESIGN §14) on the real
StatefulSet controller: the unit `sts-<name>` is made from the spec before
any pod, an OrderedReady StatefulSet runs all its pods once admitted (each
let go as the controller makes it) and none while it does not fit, and
scaled to 0 it gives its quota back. On the `integrated` sandbox.
"""

from __future__ import annotations

import time

from arbiter.sandbox import Sandbox
from tests.e2e.helpers import create, get, tenant, units, wait_for
from tests.e2e.workloads import (
    allocated_cpu,
    consumer,
    consumer_ref,
    gated,
    phase,
    pod_sets,
    pods,
    quiet,
    running,
    set_room,
    statefulset,
    unit,
)


def test_a_statefulset_waits_whole_runs_whole_and_scaled_to_0_frees_its_quota(
        integrated: Sandbox) -> None:
    sb = integrated
    quiet(sb)
    with tenant(sb, "sts", wait=60, capability={"cpu": "2"}) as (ns, q):
        create(sb, statefulset("web", ns, 3))
        created = get(sb, "statefulset", "web", "-n", ns)
        queued = wait_for("the StatefulSet's unit", lambda: unit(sb, ns, "sts-web"))
        assert consumer_ref(queued) == consumer(created)
        assert pod_sets(queued) == {"main": 3}  # from the spec: 3 pods, not those seen
        # Made before any pod of it (to the second the apiserver records).
        first = min((p["metadata"]["creationTimestamp"] for p in pods(sb, ns)), default=None)
        assert first is None or queued["metadata"]["creationTimestamp"] <= first

        time.sleep(3)  # time enough to let a pod go (wrongly)
        assert running(sb, ns) == []
        waiting = pods(sb, ns)
        # OrderedReady: the controller made web-0 and waits for it, gated.
        assert [p["metadata"]["name"] for p in waiting] == ["web-0"]
        assert all(gated(p) for p in waiting)
        # The pods have no unit of their own.
        assert [u["metadata"]["name"] for u in units(sb, ns)] == ["sts-web"]
        assert phase(unit(sb, ns, "sts-web")) == "Enqueued"
        assert allocated_cpu(sb, q) == "0"

        set_room(sb, ns, q, 3)
        wait_for("all 3 pods Running", lambda: running(sb, ns) == ["web-0", "web-1", "web-2"],
                 timeout=90)
        assert phase(unit(sb, ns, "sts-web")) in ("Dequeued", "Running")
        assert allocated_cpu(sb, q) == "3"

        sb.kubectl("scale", "statefulset", "web", "-n", ns, "--replicas=0")
        wait_for("its pods gone", lambda: pods(sb, ns) == [], timeout=60)
        wait_for("its 3 CPUs freed", lambda: allocated_cpu(sb, q) == "0", timeout=30)
