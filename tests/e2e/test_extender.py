"""The scheduler extender on the real control plane: the sandbox's
kube-scheduler calls arbiter's /scheduler/{filter,prioritize,preempt}
(10 fake nodes of 1 CPU; see tests/e2e/conftest.py)."""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest

from arbiter.sandbox import Sandbox
from tests.e2e.helpers import create, get, metrics, priority_class, tenant, unique_name, wait_for

WEBHOOK_CONFIGURATIONS = (
    "mutatingwebhookconfiguration/kube-arbiter",
    "validatingwebhookconfiguration/kube-arbiter",
)


def _extender_calls(sandbox: Sandbox) -> dict[tuple[str, str], float]:
    """arbiter_extender_requests_total by (verb, result), from arbiter's /metrics."""
    counts: dict[tuple[str, str], float] = {}
    for (name, labels), value in metrics(sandbox).items():
        if name == "arbiter_extender_requests_total":
            by_name = dict(labels)
            counts[by_name["verb"], by_name["result"]] = value
    return counts


def _tenant(sandbox: Sandbox,
            **queue_spec: Any) -> contextlib.AbstractContextManager[tuple[str, str]]:
    """A namespace and a Queue that lists it; both deleted afterwards, waiting
    until the namespace's pods are gone (they hold node capacity)."""
    return tenant(sandbox, "ext", wait=60.0, **queue_spec)


def _calls(counts: dict[tuple[str, str], float], verb: str, result: str | None = None) -> float:
    return sum(v for (vb, res), v in counts.items() if vb == verb and result in (None, res))


def _pod(name: str, namespace: str, cpu: str, *, labels: dict[str, str] | None = None,
         node_selector: dict[str, str] | None = None,
         priority_class: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "pause",
                        "resources": {"requests": {"cpu": cpu}}}],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": spec}


def _node_of(sandbox: Sandbox, namespace: str, name: str) -> str | None:
    pod = get(sandbox, "pod", "-n", namespace, name)
    node = pod["spec"].get("nodeName")
    return str(node) if node else None


def _all_bound(sandbox: Sandbox, namespace: str, count: int) -> dict[str, str] | None:
    items = get(sandbox, "pods", "-n", namespace)["items"]
    placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in items}
    if len(placed) == count and all(placed.values()):
        return placed
    return None


def _node_names(sandbox: Sandbox) -> list[str]:
    return sorted(n["metadata"]["name"] for n in get(sandbox, "nodes")["items"])


def test_managed_pods_are_placed_through_the_extender(sandbox: Sandbox) -> None:
    before = _extender_calls(sandbox)
    with _tenant(sandbox) as (namespace, _):
        for i in range(4):
            create(sandbox, _pod(f"w-{i}", namespace, "100m"))
        placed = wait_for("4 admitted pods bound", lambda: _all_bound(sandbox, namespace, 4))
        assert set(placed.values()) <= set(_node_names(sandbox))
        after = _extender_calls(sandbox)
    # Every managed pod passed filter; with 10 candidate nodes prioritize ran too.
    assert _calls(after, "filter", "passed") >= _calls(before, "filter", "passed") + 4
    assert _calls(after, "prioritize") >= _calls(before, "prioritize") + 4


@contextlib.contextmanager
def _webhooks_down(sandbox: Sandbox) -> Iterator[None]:
    """As if arbiter's webhooks were not there: remove their configurations,
    then put them back exactly as they were (arbiter keeps running, so the
    extender still answers)."""
    saved = [get(sandbox, name) for name in WEBHOOK_CONFIGURATIONS]
    for name in WEBHOOK_CONFIGURATIONS:
        sandbox.kubectl("delete", name)
    try:
        time.sleep(1.0)  # the apiserver's webhook configuration cache
        yield
    finally:
        for obj in saved:
            for key in ("resourceVersion", "uid", "creationTimestamp", "generation",
                        "managedFields"):
                obj["metadata"].pop(key, None)
        create(sandbox, *saved)
        time.sleep(1.0)


def _scheduling_failures(sandbox: Sandbox, namespace: str, pod: str) -> list[str]:
    events = get(sandbox, "events", "-n", namespace,
                 "--field-selector", f"involvedObject.name={pod},reason=FailedScheduling")
    return [str(e.get("message") or e.get("note") or "") for e in events["items"]]


def test_pod_that_bypassed_admission_stays_pending_with_the_reason(sandbox: Sandbox) -> None:
    with _tenant(sandbox, capability={"cpu": "1"}) as (namespace, queue):
        # Fill the queue to its capability the normal way.
        create(sandbox, _pod("first", namespace, "1"))
        wait_for("the admitted pod bound", lambda: _node_of(sandbox, namespace, "first"))
        # A pod that reaches the scheduler without the webhook: no gate, no unit.
        with _webhooks_down(sandbox):
            create(sandbox, _pod("sneaky", namespace, "1", labels={"arbiter.dev/queue": queue}))
        pod = get(sandbox, "pod", "-n", namespace, "sneaky")
        assert not pod["spec"].get("schedulingGates")  # the webhook really was bypassed
        messages = wait_for(
            "a FailedScheduling event with arbiter's reason",
            lambda: [m for m in _scheduling_failures(sandbox, namespace, "sneaky")
                     if f'queue "{queue}"' in m],
        )
        message = messages[-1]
        assert f'queue "{queue}" has not admitted this pod' in message
        assert f"no QueueUnit {namespace}/pod-sneaky" in message
        assert "created while arbiter was down" in message
        assert "would exceed its capability: cpu 1 in use + 1 requested > 1" in message
        time.sleep(3)
        assert _node_of(sandbox, namespace, "sneaky") is None


def test_queue_node_selector_confines_placement(sandbox: Sandbox) -> None:
    key = "arbiter-e2e/pool"
    value = unique_name("pool")
    chosen = _node_names(sandbox)[:3]
    for node in chosen:
        sandbox.kubectl("label", "node", node, f"{key}={value}", "--overwrite")
    try:
        with _tenant(sandbox, nodeSelector={key: value}) as (namespace, _):
            for i in range(6):
                create(sandbox, _pod(f"c-{i}", namespace, "100m"))
            placed = wait_for("6 pods bound", lambda: _all_bound(sandbox, namespace, 6))
            assert set(placed.values()) <= set(chosen), placed
    finally:
        for node in chosen:
            sandbox.kubectl("label", "node", node, f"{key}-", check=False)


@contextlib.contextmanager
def _priority_classes(sandbox: Sandbox) -> Iterator[tuple[str, str]]:
    low, high = unique_name("low"), unique_name("high")
    create(sandbox, priority_class(low, 10), priority_class(high, 100_000))
    try:
        yield low, high
    finally:
        sandbox.kubectl("delete", "priorityclass", low, high, "--ignore-not-found", check=False)


def _fill_every_node(sandbox: Sandbox, namespace: str, klass: str) -> list[str]:
    """One 600m pod pinned to each node: no node has 1 CPU free afterwards."""
    nodes = _node_names(sandbox)
    for i, node in enumerate(nodes):
        create(sandbox, _pod(f"b-{i}", namespace, "600m", priority_class=klass,
                             node_selector={"kubernetes.io/hostname": node}))
    wait_for("the low-priority tenant on every node",
             lambda: _all_bound(sandbox, namespace, len(nodes)))
    return nodes


def _uids(sandbox: Sandbox, namespace: str) -> set[str]:
    return {p["metadata"]["uid"] for p in get(sandbox, "pods", "-n", namespace)["items"]
            if not p["metadata"].get("deletionTimestamp")}


def test_a_pod_that_fits_no_node_is_held_not_sent_to_preemption(sandbox: Sandbox) -> None:
    """Every node has 400m free (4 CPU in total): a 1-CPU pod fits in total
    but on no node. Before placement-aware admission it was admitted and
    kube-scheduler preempted for it (through the extender's preempt verb);
    now arbiter keeps it gated, says why on its QueueUnit, and kube-scheduler
    is never asked to make room: no victim, no preempt call."""
    with _priority_classes(sandbox) as (low, high), \
            _tenant(sandbox) as (ns_b, _), _tenant(sandbox) as (ns_a, _):
        _fill_every_node(sandbox, ns_b, low)
        victims = _uids(sandbox, ns_b)
        before = _extender_calls(sandbox)
        create(sandbox, _pod("urgent", ns_a, "1", priority_class=high))
        def unit_message() -> str | None:
            found = get(sandbox, "queueunits", "-n", ns_a)["items"]
            texts = [(u.get("status") or {}).get("message", "") for u in found]
            return next((text for text in texts if "largest free" in text), None)

        message = wait_for("the urgent pod's QueueUnit to say no node has room",
                           unit_message, timeout=60)
        assert "needs 1 cpu per pod" in message, message
        time.sleep(3)
        pod = get(sandbox, "pod", "-n", ns_a, "urgent")
        assert any(g.get("name") == "arbiter.dev/admission"
                   for g in pod["spec"].get("schedulingGates") or [])
        assert _node_of(sandbox, ns_a, "urgent") is None
        after = _extender_calls(sandbox)
        assert _calls(after, "preempt", "allowed") == _calls(before, "preempt", "allowed")
        assert _calls(after, "preempt", "blocked") == _calls(before, "preempt", "blocked")
        assert _uids(sandbox, ns_b) == victims  # nobody was evicted


@pytest.fixture(autouse=True)
def _extender_is_wired(sandbox: Sandbox) -> None:
    document = sandbox.scheduler_config()
    (extender,) = document["extenders"]
    assert extender["urlPrefix"].endswith("/scheduler")


def _forged_filter(port: int, context: ssl.SSLContext) -> int | str:
    """POST a filter call for a made-up pod; its status, or the error that ended it."""
    body = json.dumps({"Pod": {"metadata": {"name": "forged", "namespace": "x", "uid": "f-1"}},
                       "NodeNames": ["kwok-node-0"]})
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.request("POST", "/scheduler/filter", body=body,
                           headers={"Content-Type": "application/json"})
        return connection.getresponse().status
    except (ssl.SSLError, OSError) as error:
        return type(error).__name__
    finally:
        connection.close()


def test_a_forged_filter_call_without_a_client_certificate_is_refused(
        sandbox: Sandbox) -> None:
    """Only kube-scheduler (its client certificate, signed by the CA arbiter
    is given with --extender-client-ca) reaches the extender; the webhook
    port does not serve it at all."""
    port = sandbox.extender_port
    assert port is not None
    trust = ssl.create_default_context(cafile=str(sandbox.arbiter_cert_dir / "ca.crt"))
    status = _forged_filter(port, trust)
    assert isinstance(status, str) or 400 <= status < 500, status
    webhook_port = sandbox.arbiter_port
    assert webhook_port is not None
    assert _forged_filter(webhook_port, trust) == 404
    keys = sandbox.pki
    # The cluster CA signs other clients too: the admin's certificate passes
    # the handshake but is not kube-scheduler's, so the call is refused.
    admin = ssl.create_default_context(cafile=str(sandbox.arbiter_cert_dir / "ca.crt"))
    admin.load_cert_chain(keys.client_cert("admin"), keys.client_key("admin"))
    assert _forged_filter(port, admin) == 403
    # With the scheduler's own certificate the same call is answered.
    trust.load_cert_chain(keys.client_cert("kube-scheduler"), keys.client_key("kube-scheduler"))
    assert _forged_filter(port, trust) == 200
