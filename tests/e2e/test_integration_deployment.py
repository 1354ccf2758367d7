"""Deployments queued pod by pod (issue 28, DESIGN §14) on the real
Deployment and ReplicaSet controllers: a Deployment must have a queue, its
pods carry it and each waits for room on its own; and the YAML examples of
docs/integrations.md work as written. On the `integrated` sandbox.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import yaml

from arbiter.core.api import QUEUE_LABEL
from arbiter.sandbox import Sandbox
from arbiter.sandbox.components import repo_root
from tests.deploy.manifests import yaml_blocks
from tests.e2e.helpers import (
    create,
    create_namespace,
    delete_tenants,
    get,
    tenant,
    unique_name,
    wait_for,
)
from tests.e2e.workloads import (
    allocated_cpu,
    deployment,
    gated,
    phase,
    pods,
    quiet,
    running,
    set_room,
    unit,
)

DOC = repo_root() / "docs" / "integrations.md"


def test_a_deployment_runs_as_many_pods_as_there_is_room_for(integrated: Sandbox) -> None:
    sb = integrated
    quiet(sb)
    with tenant(sb, "deploy", wait=60, capability={"cpu": "2"}) as (ns, q):
        create(sb, deployment("web", ns, 3))
        assert get(sb, "deployment", "web", "-n", ns)["spec"]["template"]["metadata"][
            "labels"].get(QUEUE_LABEL) == q
        wait_for("its 3 pods", lambda: len(pods(sb, ns)) == 3)
        wait_for("2 of them Running", lambda: len(running(sb, ns)) == 2, timeout=60)
        time.sleep(3)  # time enough to let the third go (wrongly)
        assert len(running(sb, ns)) == 2
        third = [p for p in pods(sb, ns) if p["status"].get("phase") != "Running"]
        assert len(third) == 1 and gated(third[0])
        assert all(p["metadata"]["labels"].get(QUEUE_LABEL) == q for p in pods(sb, ns))
        assert allocated_cpu(sb, q) == "2"

        set_room(sb, ns, q, 3)
        wait_for("the third pod Running", lambda: len(running(sb, ns)) == 3, timeout=60)
        assert allocated_cpu(sb, q) == "3"


def test_a_deployment_without_a_queue_is_refused_naming_the_namespace(
        integrated: Sandbox) -> None:
    sb = integrated
    ns = unique_name("noqueue")
    create_namespace(sb, ns)
    try:
        refused = sb.kubectl("create", "-f", "-", input=json.dumps(deployment("web", ns, 1)),
                             check=False)
        assert refused.returncode != 0
        assert ns in refused.stderr, refused.stderr
        assert get(sb, "deployments", "-n", ns)["items"] == []
    finally:
        delete_tenants(sb, [ns], [])


UNIT_OF = {"JobSet": "jobset-{}", "StatefulSet": "sts-{}", "LeaderWorkerSet": "lws-{}-0",
           "TrainJob": "trainjob-{}", "RayCluster": "raycluster-{}", "RayJob": "rayjob-{}"}
STARTED = ("Dequeued", "Running", "Succeed")


def _started(sb: Sandbox, doc: dict[str, Any]) -> bool:
    """A documented workload admitted: its (first) unit, or a Deployment's pods Running."""
    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    if doc["kind"] == "Deployment":
        return len(running(sb, ns, f"app={name}")) == int(doc["spec"]["replicas"])
    return phase(unit(sb, ns, UNIT_OF[doc["kind"]].format(name))) in STARTED


def test_the_documented_examples_run_as_written(integrated: Sandbox) -> None:
    """Every YAML block of docs/integrations.md, applied as a reader would
    (`kubectl apply -f`): each workload is admitted and starts."""
    sb = integrated
    quiet(sb)
    # The built-in kinds' (the declared section's run in test_integration_declared.py).
    blocks = yaml_blocks(DOC, until="## Declared integrations")
    documents = [d for block in blocks for d in yaml.safe_load_all(block) if d]
    namespaces = sorted(d["metadata"]["name"] for d in documents if d["kind"] == "Namespace")
    queues = sorted(d["metadata"]["name"] for d in documents if d["kind"] == "Queue")
    workloads = [d for d in documents if d["kind"] in (*UNIT_OF, "Deployment")]
    assert {d["kind"] for d in workloads} == {*UNIT_OF, "Deployment"} and namespaces and queues
    try:
        for block in blocks:
            sb.apply_yaml(block)
            time.sleep(0.5)  # the webhook resolves a new Queue from its cache
        for doc in workloads:
            wait_for(f"{doc['kind']} {doc['metadata']['name']} admitted",
                     partial(_started, sb, doc), timeout=60)
    finally:
        delete_tenants(sb, namespaces, [], wait=60)
        delete_tenants(sb, [], queues)
