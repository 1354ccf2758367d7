"""Placement-aware admission on the real control plane (issue 17, DESIGN §10;
10 fake nodes × 1 CPU): a unit is admitted only where its pods can run.

The primary arbiter runs with a short reclaim grace here, so a reclaim that
would evict work the waiting unit cannot use anyway (its queue is confined
to other nodes) would show within the test, and a short admission timeout,
so a Job that cannot start is requeued (and admitted again) within one.
Nodes are labelled for a test and unlabelled afterwards; Pools are deleted
afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from arbiter.base.kubeapi import Invalid, KubeApi, job_path
from arbiter.cache.convert import unit_status
from arbiter.core.api import MANAGED_LABEL
from arbiter.loop.actions import Actions
from arbiter.loop.placement import PodDirectives
from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    CPUS,
    admissions,
    arbiter_with,
    create,
    get,
    job,
    metrics,
    namespace,
    pod,
    scenario,
    suffix,
    units,
    wait_for,
)

NODES = [f"kwok-node-{index}" for index in range(CPUS)]
# The pool's nodes: the last by name, so first-fit placement of unconfined
# work does not reach them first.
POOL_NODES = NODES[-2:]
GRACE = 5.0
# Admitted units that do not start in this long are backed off and requeued
# (long enough that nothing else in this module times out on a busy machine).
ADMISSION_TIMEOUT = 30.0
LONG = "10m"  # the Jobs here run until their namespace goes


@pytest.fixture(scope="module", autouse=True)
def short_grace(sandbox: Sandbox) -> Iterator[None]:
    with arbiter_with(sandbox, ["--reclaim-grace", str(GRACE),
                                "--admission-timeout", str(ADMISSION_TIMEOUT)]):
        yield


@contextmanager
def labelled(sandbox: Sandbox, nodes: list[str], key: str, value: str) -> Iterator[None]:
    sandbox.kubectl("label", "node", *nodes, f"{key}={value}", "--overwrite")
    try:
        yield
    finally:
        sandbox.kubectl("label", "node", *nodes, f"{key}-", check=False)


def pool_object(name: str, selector: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "Pool",
            "metadata": {"name": name}, "spec": {"nodeSelector": selector}}


def long_job(name: str, ns: str, *, cpu: str = "1", pods: int = 1) -> dict[str, Any]:
    body = job(name, ns, cpu=cpu, runs_for=LONG)
    body["spec"]["parallelism"] = pods
    body["spec"]["completions"] = pods
    return body


def pods_of(sandbox: Sandbox, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(sandbox, "pods", "-n", ns)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def unsuspended(sandbox: Sandbox, ns: str) -> int:
    return sum(1 for j in get(sandbox, "jobs", "-n", ns)["items"] if not j["spec"].get("suspend"))


def admitted(sandbox: Sandbox, ns: str) -> list[dict[str, Any]]:
    return [u for u in units(sandbox, ns)
            if (u.get("status") or {}).get("phase") in ("Dequeued", "Running")]


def bound_nodes(sandbox: Sandbox, ns: str) -> list[str]:
    return sorted(p["spec"]["nodeName"] for p in pods_of(sandbox, ns)
                  if p["spec"].get("nodeName"))


def no_pod_pending(sandbox: Sandbox, *namespaces: str) -> None:
    for ns in namespaces:
        pending = [p["metadata"]["name"] for p in pods_of(sandbox, ns)
                   if not p["spec"].get("nodeName")]
        assert pending == [], f"admitted pods without a node in {ns}: {pending}"


def state(sandbox: Sandbox, *namespaces: str) -> str:
    """Units and pods of `namespaces`, one line each (for failure messages)."""
    lines = []
    for ns in namespaces:
        for unit in units(sandbox, ns):
            got = unit.get("status") or {}
            lines.append(f"{ns}/{unit['metadata']['name']}: {got.get('phase')} "
                         f"{got.get('admission')} {got.get('message')}")
        lines += [f"{ns}/{p['metadata']['name']}: node={p['spec'].get('nodeName')} "
                  f"selector={p['spec'].get('nodeSelector')}" for p in pods_of(sandbox, ns)]
    return "\n".join(lines)


def taken_back(sandbox: Sandbox, queue_name: str) -> float:
    return metrics(sandbox).get(
        ("arbiter_preempted_units_total", (("queue", queue_name), ("reason", "reclaim"))), 0.0)


def bound(sandbox: Sandbox, ns: str, count: int) -> list[str] | None:
    nodes = bound_nodes(sandbox, ns)
    return nodes if len(nodes) == count else None


def confined_then_open(sandbox: Sandbox, confined: dict[str, Any], label: str) -> None:
    """Five 1-CPU Jobs in a queue confined to POOL_NODES (labelled `label`),
    then ten in a queue without limits: exactly 2 + 8 admitted, each bound
    where planned, none of them Pending; a reclaim grace later, the same."""
    tag = suffix()
    small, big = f"confined-{tag}", f"open-{tag}"
    ns_small, ns_big = f"pl-small-{tag}", f"pl-big-{tag}"
    started = time.monotonic()
    with scenario(sandbox, {small: {"namespaces": [ns_small], **confined},
                            big: {"namespaces": [ns_big]}}, [ns_small, ns_big]):
        create(sandbox, *(long_job(f"s{i}", ns_small) for i in range(5)))
        nodes = wait_for("the confined queue's two Jobs bound",
                         lambda: bound(sandbox, ns_small, 2), timeout=60)
        assert nodes == POOL_NODES
        create(sandbox, *(long_job(f"b{i}", ns_big) for i in range(10)))
        try:
            wait_for("eight of the open queue's Jobs bound",
                     lambda: bound(sandbox, ns_big, 8), timeout=90)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{state(sandbox, ns_small, ns_big)}") from None
        # Past the reclaim grace: nothing moved (the waiting confined Jobs
        # cannot use the open queue's nodes, so nothing is taken from it).
        time.sleep(GRACE + 6)
        assert len(admitted(sandbox, ns_small)) == 2 and unsuspended(sandbox, ns_small) == 2
        assert len(admitted(sandbox, ns_big)) == 8 and unsuspended(sandbox, ns_big) == 8
        # Admitted once each: nothing was taken back and admitted again.
        assert all(len(admissions(u)) == 1 for u in admitted(sandbox, ns_big))
        assert taken_back(sandbox, big) == 0
        assert bound_nodes(sandbox, ns_small) == POOL_NODES
        assert not set(bound_nodes(sandbox, ns_big)) & set(POOL_NODES)
        no_pod_pending(sandbox, ns_small, ns_big)
        for unit in admitted(sandbox, ns_small):
            planned = unit["status"]["admission"]["nodes"]["main"]
            assert len(planned) == 1 and planned[0] in POOL_NODES, unit["status"]
        waiting = [u for u in units(sandbox, ns_small) if u not in admitted(sandbox, ns_small)]
        assert len(waiting) == 3
        # The plan travelled: the released Jobs' templates select the nodes.
        for item in get(sandbox, "jobs", "-n", ns_small)["items"]:
            if not item["spec"].get("suspend"):
                selector = item["spec"]["template"]["spec"].get("nodeSelector") or {}
                assert selector.get(label) == "yes", item["spec"]["template"]["spec"]
    print(f"\nconfined {json.dumps(confined)}: {time.monotonic() - started:.1f}s")


def test_a_queue_confined_by_node_selector_admits_what_its_nodes_hold(
        sandbox: Sandbox) -> None:
    key = f"e2e-place-{suffix()}"
    with labelled(sandbox, POOL_NODES, key, "yes"):
        confined_then_open(sandbox, {"nodeSelector": {key: "yes"}}, key)


def test_a_queue_confined_to_a_pool_admits_what_the_pool_holds(sandbox: Sandbox) -> None:
    tag = suffix()
    key, name = f"e2e-pool-{tag}", f"fast-{tag}"
    with labelled(sandbox, POOL_NODES, key, "yes"):
        create(sandbox, pool_object(name, {key: "yes"}))
        try:
            wait_for("the Pool's status", lambda: (get(sandbox, "pool", name).get("status")
                                                  or {}).get("nodes") == 2, timeout=30)
            confined_then_open(sandbox, {"pools": [name]}, key)
        finally:
            sandbox.kubectl("delete", "pool", name, "--ignore-not-found", check=False)


def test_fragmented_free_space_admits_only_what_fits_on_a_node(sandbox: Sandbox) -> None:
    """Ten unmanaged 600m pods, one per node (4 CPU free in total, 400m per
    node): 2 × 1 CPU stays suspended, saying why; 4 × 300m runs."""
    tag = suffix()
    name, ns, filler = f"frag-{tag}", f"pl-frag-{tag}", f"pl-fill-{tag}"
    started = time.monotonic()
    # Out of arbiter's hands from the start: the webhook lets its pods be.
    create(sandbox, namespace(filler, {MANAGED_LABEL: "false"}))
    try:
        fragmented(sandbox, name, ns, filler)
    finally:
        sandbox.kubectl("delete", "namespace", filler, "--timeout=120s", check=False)
    print(f"\nfragmented: {time.monotonic() - started:.1f}s")


def fillers(ns: str, nodes: list[str], cpu: str) -> list[dict[str, Any]]:
    """One pod per node, placed by name (past kube-scheduler and arbiter)."""
    bodies = []
    for index, node in enumerate(nodes):
        body = pod(f"fill-{index}", ns, cpu=cpu)
        body["spec"]["nodeName"] = node
        bodies.append(body)
    return bodies


def fragmented(sandbox: Sandbox, name: str, ns: str, filler: str) -> None:
    with scenario(sandbox, {name: {"namespaces": [ns]}}, [ns]):
        create(sandbox, *fillers(filler, NODES, "600m"))
        wait_for("the fillers running", lambda: sum(
            1 for p in pods_of(sandbox, filler)
            if (p.get("status") or {}).get("phase") == "Running") == CPUS, timeout=60)
        create(sandbox, long_job("wide", ns, cpu="1", pods=2))
        unit = wait_for("the wide Job's unit says why it waits", lambda: next(
            (u for u in units(sandbox, ns)
             if "no node has room" in (u.get("status") or {}).get("message", "")), None),
            timeout=60)
        assert "400m cpu" in unit["status"]["message"], unit["status"]
        assert "needs 1 cpu per pod" in unit["status"]["message"], unit["status"]
        create(sandbox, long_job("narrow", ns, cpu="300m", pods=4))
        nodes = wait_for("the narrow Job's four pods bound",
                         lambda: bound(sandbox, ns, 4), timeout=60)
        assert len(set(nodes)) == 4  # one per node: 400m free on each
        wide = get(sandbox, "job", "wide", "-n", ns)
        assert wide["spec"]["suspend"] is True
        assert (get(sandbox, "queueunit", "job-wide", "-n", ns).get("status")
                or {}).get("phase") == "Enqueued"
        no_pod_pending(sandbox, ns)


def test_pool_and_queue_status_show_per_pool_usage(sandbox: Sandbox) -> None:
    tag = suffix()
    key, name = f"e2e-stat-{tag}", f"stat-{tag}"
    qname, ns = f"stat-q-{tag}", f"pl-stat-{tag}"
    with labelled(sandbox, POOL_NODES, key, "yes"):
        create(sandbox, pool_object(name, {key: "yes"}))
        try:
            with scenario(sandbox, {qname: {"namespaces": [ns], "pools": [name]}}, [ns]):
                create(sandbox, long_job("one", ns))
                wait_for("one pod bound", lambda: bound(sandbox, ns, 1), timeout=60)
                status = wait_for("the Pool's allocated", lambda: (
                    s if (s := get(sandbox, "pool", name).get("status") or {})
                    .get("allocated", {}).get("cpu") == "1" else None), timeout=30)
                assert status["nodes"] == 2 and status["capacity"]["cpu"] == "2"
                shares = wait_for("the Queue's pools", lambda: (
                    get(sandbox, "queue", qname).get("status") or {}).get("pools"), timeout=30)
                assert shares == [{"name": name, "admitted": 1, "allocated": {"cpu": "1"}}]
                printed = sandbox.kubectl("get", "pool", name).stdout
                assert "cpu=2" in printed and "cpu=1" in printed, printed
        finally:
            sandbox.kubectl("delete", "pool", name, "--ignore-not-found", check=False)



def test_a_gated_pod_gets_its_pools_selector_and_binds_there(sandbox: Sandbox) -> None:
    """A plain pod (held by the scheduling gate) in a queue limited to a
    Pool over two labelled nodes: the gate comes off in the same patch that
    adds the pool's nodeSelector and toleration, and it binds on one of them."""
    tag = suffix()
    key, name = f"e2e-gate-{tag}", f"gate-{tag}"
    qname, ns = f"gate-q-{tag}", f"pl-gate-{tag}"
    toleration = {"key": key, "operator": "Exists", "effect": "NoSchedule"}
    body = pool_object(name, {key: "yes"})
    body["spec"]["tolerations"] = [toleration]
    with labelled(sandbox, POOL_NODES, key, "yes"):
        create(sandbox, body)
        try:
            wait_for("the Pool's status", lambda: (get(sandbox, "pool", name).get("status")
                                                  or {}).get("nodes") == 2, timeout=30)
            with scenario(sandbox, {qname: {"namespaces": [ns], "pools": [name]}}, [ns]):
                create(sandbox, pod("probe", ns, cpu="500m"))
                nodes = wait_for("the pod bound", lambda: bound(sandbox, ns, 1), timeout=60)
                assert nodes[0] in POOL_NODES, state(sandbox, ns)
                spec = get(sandbox, "pod", "probe", "-n", ns)["spec"]
                assert spec["nodeSelector"] == {key: "yes"}, spec
                assert toleration in spec["tolerations"], spec
                assert not spec.get("schedulingGates"), spec
                (unit,) = units(sandbox, ns)
                admission = unit["status"]["admission"]
                assert admission["pool"] == name, unit["status"]
                assert admission["nodes"]["main"][0] in POOL_NODES, unit["status"]
        finally:
            sandbox.kubectl("delete", "pool", name, "--ignore-not-found", check=False)


def test_a_job_admitted_again_into_another_pool_loses_the_first_pools_selector(
        sandbox: Sandbox) -> None:
    """Pool A's nodes are tainted (its pods cannot start there); a Job
    admitted into A times out, A fills up meanwhile, and the Job is admitted
    again into pool B: its template selects B's nodes only, and it binds there."""
    tag = suffix()
    key_a, key_b = f"e2e-ra-{tag}", f"e2e-rb-{tag}"
    pool_a, pool_b = f"ra-{tag}", f"rb-{tag}"
    qname, ns, filler = f"re-q-{tag}", f"pl-re-{tag}", f"pl-re-fill-{tag}"
    nodes_b = NODES[-4:-2]
    with labelled(sandbox, POOL_NODES, key_a, "yes"), labelled(sandbox, nodes_b, key_b, "yes"):
        sandbox.kubectl("taint", "node", *POOL_NODES, f"{key_a}=yes:NoSchedule")
        create(sandbox, pool_object(pool_a, {key_a: "yes"}), pool_object(pool_b, {key_b: "yes"}))
        try:
            with scenario(sandbox, {qname: {"namespaces": [ns], "pools": [pool_a, pool_b]}},
                          [ns]):
                readmitted(sandbox, ns, filler, (key_a, pool_a), (key_b, pool_b), nodes_b)
        finally:
            sandbox.kubectl("taint", "node", *POOL_NODES, f"{key_a}-", check=False)
            sandbox.kubectl("delete", "namespace", filler, "--ignore-not-found",
                            "--timeout=120s", check=False)
            sandbox.kubectl("delete", "pool", pool_a, pool_b, "--ignore-not-found", check=False)


def readmitted(sandbox: Sandbox, ns: str, filler: str, first: tuple[str, str],
               second: tuple[str, str], nodes_b: list[str]) -> None:
    (key_a, pool_a), (key_b, pool_b) = first, second
    create(sandbox, long_job("train", ns))

    def in_pool(name: str) -> dict[str, Any] | None:
        status = dict(unit_status(get(sandbox, "queueunit", "job-train", "-n", ns)))
        admission = status.get("admission") or {}
        return status if admission.get("pool") == name and status.get("phase") in (
            "Dequeued", "Running") else None

    wait_for("the Job admitted into pool A", lambda: in_pool(pool_a), timeout=60)
    template = get(sandbox, "job", "train", "-n", ns)["spec"]["template"]["spec"]
    assert template["nodeSelector"] == {key_a: "yes"}, template
    # Pool A fills up (unmanaged pods placed by name): the retry must go to B.
    create(sandbox, namespace(filler, {MANAGED_LABEL: "false"}))
    create(sandbox, *fillers(filler, POOL_NODES, "1"))
    wait_for("the Job admitted again, into pool B", lambda: in_pool(pool_b),
             timeout=ADMISSION_TIMEOUT + 60)
    nodes = wait_for("the Job's pod bound", lambda: bound(sandbox, ns, 1), timeout=60)
    assert nodes[0] in nodes_b, state(sandbox, ns)
    job_obj = get(sandbox, "job", "train", "-n", ns)
    assert job_obj["spec"]["template"]["spec"]["nodeSelector"] == {key_b: "yes"}, job_obj
    placed = json.loads(job_obj["metadata"]["annotations"]["arbiter.dev/placed"])
    assert placed["nodeSelector"] == {key_b: "yes"}, placed
    assert len(admissions(get(sandbox, "queueunit", "job-train", "-n", ns))) == 2


def test_a_queue_confined_to_full_nodes_reclaims_there(sandbox: Sandbox) -> None:
    """Two queues confined to POOL_NODES; A runs a Job on each. B's Jobs fit
    the cluster's free total (eight empty nodes) but no node B may use. B is
    poorer: after the grace it takes one of A's Jobs back, and its own Job
    binds on the node that frees; then nothing more moves (one each)."""
    tag = suffix()
    key = f"e2e-room-{tag}"
    qa, qb = f"rooma-{tag}", f"roomb-{tag}"
    confined = {"nodeSelector": {key: "yes"}}
    with labelled(sandbox, POOL_NODES, key, "yes"), scenario(
            sandbox, {qa: {"namespaces": [qa], **confined},
                      qb: {"namespaces": [qb], **confined}}, [qa, qb]):
        create(sandbox, *(long_job(f"a{i}", qa) for i in range(2)))
        assert wait_for("A's two Jobs bound", lambda: bound(sandbox, qa, 2),
                        timeout=60) == POOL_NODES
        before = taken_back(sandbox, qa)
        started = time.monotonic()
        create(sandbox, *(long_job(f"b{i}", qb) for i in range(2)))
        try:
            nodes = wait_for("one of B's Jobs bound", lambda: bound(sandbox, qb, 1),
                             timeout=90)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{state(sandbox, qa, qb)}") from None
        took = time.monotonic() - started
        assert took >= GRACE and nodes[0] in POOL_NODES
        time.sleep(GRACE + 6)  # past another grace: 1 and 1 is fair, nothing moves
        assert (unsuspended(sandbox, qa), unsuspended(sandbox, qb)) == (1, 1), \
            state(sandbox, qa, qb)
        assert taken_back(sandbox, qa) - before == 1
        assert sorted(bound_nodes(sandbox, qa) + bound_nodes(sandbox, qb)) == POOL_NODES
        no_pod_pending(sandbox, qa, qb)
    print(f"\nreclaim inside a selector: B's Job bound after {took:.1f}s (grace {GRACE:.0f}s)")


def test_the_apiserver_passes_a_test_for_null_only_while_the_map_is_absent(
        sandbox: Sandbox) -> None:
    """What a release's guard on a Job without annotations rests on
    (arbiter.loop.placement._map_test): the apiserver's JSON patch passes
    `test /metadata/annotations null` while the object has none, whatever
    else was written since, and fails it once a map was added."""
    name = f"guard-{suffix()}"
    sandbox.kubectl("create", "configmap", name, "-n", "default", "--from-literal=a=1")
    try:
        guarded = [{"op": "test", "path": "/metadata/annotations", "value": None},
                   {"op": "add", "path": "/metadata/annotations", "value": {"mine": "x"}}]
        sandbox.kubectl("patch", "configmap", name, "-n", "default", "--type=merge",
                        "-p", json.dumps({"data": {"a": "2"}}))  # another write meanwhile
        first = sandbox.kubectl("patch", "configmap", name, "-n", "default", "--type=json",
                                "-p", json.dumps(guarded), check=False)
        assert first.returncode == 0, first.stderr
        again = sandbox.kubectl("patch", "configmap", name, "-n", "default", "--type=json",
                                "-p", json.dumps(guarded), check=False)
        # 422: the test failed (kubectl shows no more than "the request is invalid").
        assert again.returncode != 0 and "invalid" in again.stderr.lower(), again.stderr
        annotations = json.loads(sandbox.kubectl(
            "get", "configmap", name, "-n", "default", "-o", "json").stdout)["metadata"].get(
            "annotations")
        assert annotations == {"mine": "x"}
    finally:
        sandbox.kubectl("delete", "configmap", name, "-n", "default", "--wait=false",
                        check=False)


async def test_a_held_job_whose_start_time_lingers_is_released_into_another_pool(
        sandbox: Sandbox, kube_api: Any) -> None:
    """arbiter.loop.actions.Actions._unlock_template on the real apiserver:
    a Job held again before any controller saw it keeps status.startTime,
    and the apiserver refuses its template a new nodeSelector; the release
    takes the startTime off (jobs/status) and goes through. `managedBy`
    keeps the built-in Job controller out, so nothing clears it but arbiter."""
    ns = f"unfix-{suffix()}"
    create(sandbox, namespace(ns, {MANAGED_LABEL: "false"}))
    api = KubeApi(kube_api)
    path = job_path(ns, "train")
    try:
        created = await api.create(path.rsplit("/", 1)[0], {
            "metadata": {"name": "train", "namespace": ns},
            "spec": {"managedBy": "example.com/nobody", "suspend": False,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [
                         {"name": "main", "image": "busybox"}]}}}})
        # What the Job controller does on resume, then arbiter holds it again.
        await api.json_patch(path + "/status", [
            {"op": "add", "path": "/status/startTime", "value": "2026-11-28T21:49:00Z"}])
        await api.json_patch(path, [{"op": "add", "path": "/spec/suspend", "value": True}])
        with pytest.raises(Invalid) as refused:
            await api.json_patch(path, [{"op": "add", "path": "/spec/template/spec/nodeSelector",
                                         "value": {"pool": "b"}}])
        assert "immutable" in str(refused.value)
        await Actions(api).release_job_placed(ns, "train", created["metadata"]["uid"],
                                              PodDirectives((("pool", "b"),)))
        released = await api.get(path)
        assert released["spec"]["suspend"] is False
        assert released["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "b"}
        assert "startTime" not in (released.get("status") or {})
    finally:
        sandbox.kubectl("delete", "namespace", ns, "--wait=false", check=False)
