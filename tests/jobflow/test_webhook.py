"""JobFlow validation: structure, cycles named, templates and queue from the cache,
flows frozen once started."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import orjson

from arbiter.cache.store import KINDS, ClusterStore
from arbiter.core.api import QUEUE_LABEL
from webhook import jobflows
from webhook.endpoints import BY_PATH
from webhook.review import AdmissionEnv, Decision, parse_review

Json = dict[str, Any]
NS = "ml"


def make_store(*, templates: tuple[str, ...] = ("a", "b", "c", "train"),
               namespace_queue: bool = True) -> ClusterStore:
    store = ClusterStore()
    store.replace_all("Queue", [
        {"metadata": {"name": "team"},
         "spec": {"namespaces": [NS] if namespace_queue else []}},
        {"metadata": {"name": "closed"}, "spec": {"state": "Closed"}},
    ])
    store.replace_all("Namespace", [{"metadata": {"name": NS}}])
    store.replace_all("JobTemplate", [
        {"metadata": {"name": t, "namespace": NS}, "spec": {"template": {}}}
        for t in templates
    ])
    store.synced_kinds.update(KINDS)
    store.synced_kinds.update({"JobFlow"})
    return store


def jobflow(flows: list[Json], *, name: str = "demo", phase: str | None = None,
            **spec: Any) -> Json:
    obj: Json = {"apiVersion": "arbiter.dev/v1alpha1", "kind": "JobFlow",
                 "metadata": {"name": name, "namespace": NS, "uid": str(uuid.uuid4())},
                 "spec": {"flows": flows, "jobRetainPolicy": "retain", **spec}}
    if phase is not None:
        obj["status"] = {"state": {"phase": phase}}
    return obj


def check(obj: Json, store: ClusterStore | None = None, *, operation: str = "CREATE",
          old: Json | None = None) -> Decision:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "arbiter.dev", "version": "v1alpha1", "kind": "JobFlow"},
        "resource": {"group": "arbiter.dev", "version": "v1alpha1", "resource": "jobflows"},
        "operation": operation, "namespace": NS, "name": obj["metadata"]["name"],
        "userInfo": {"username": "kubernetes-admin"},
        "object": obj, "oldObject": old,
    }}
    request = parse_review(orjson.dumps(body), jobflows.GROUP, jobflows.KIND)
    return jobflows.validate(request, AdmissionEnv(store=store or make_store()))


CHAIN: list[Json] = [{"name": "a"}, {"name": "b", "dependsOn": {"targets": ["a"]}},
         {"name": "c", "dependsOn": {"targets": ["b"], "condition": "Succeeded"}}]


def test_valid_flow_is_allowed() -> None:
    decision = check(jobflow(CHAIN))
    assert decision.allowed, decision.message


def test_cycle_is_denied_with_its_steps() -> None:
    flows = [{"name": "a", "dependsOn": {"targets": ["c"]}},
             {"name": "b", "dependsOn": {"targets": ["a"]}},
             {"name": "c", "dependsOn": {"targets": ["b"]}}]
    decision = check(jobflow(flows))
    assert not decision.allowed
    assert decision.code == 422
    assert "spec.flows: cycle a -> b -> c -> a" in decision.message


def test_unknown_target_duplicate_and_self_dependency_are_denied() -> None:
    flows: list[Json] = [{"name": "a"}, {"name": "a"},
                         {"name": "b", "dependsOn": {"targets": ["b"]}},
                         {"name": "c", "dependsOn": {"targets": ["nope"]}}]
    message = check(jobflow(flows)).message
    assert 'spec.flows[1].name: duplicate step name "a"' in message
    assert 'step "b" depends on itself' in message
    assert '"nope" is not a step of this flow' in message


def test_missing_template_is_denied_by_name() -> None:
    decision = check(jobflow([{"name": "a"}, {"name": "x", "template": "absent"}]))
    assert not decision.allowed
    assert 'spec.flows[1].template: JobTemplate "absent" not found in namespace "ml"' \
        in decision.message
    decision = check(jobflow([{"name": "zzz"}]))
    assert 'spec.flows[0].name: JobTemplate "zzz" not found' in decision.message


def test_queue_must_resolve_and_be_open() -> None:
    no_queue = check(jobflow(CHAIN), make_store(namespace_queue=False))
    assert not no_queue.allowed
    assert 'namespace "ml" has no queue' in no_queue.message
    assert check(jobflow(CHAIN, queue="team"), make_store(namespace_queue=False)).allowed
    unknown = check(jobflow(CHAIN, queue="ghost"))
    assert 'spec.queue: queue "ghost" does not exist' in unknown.message
    closed = check(jobflow(CHAIN, queue="closed"))
    assert not closed.allowed and "Closed" in closed.message
    labelled = jobflow(CHAIN)
    labelled["metadata"]["labels"] = {QUEUE_LABEL: "closed"}
    assert not check(labelled).allowed


def test_flows_are_frozen_once_started() -> None:
    old = jobflow(CHAIN, phase="Running")
    new = copy.deepcopy(old)
    new["spec"]["flows"].append({"name": "train", "dependsOn": {"targets": ["c"]}})
    decision = check(new, operation="UPDATE", old=old)
    assert not decision.allowed
    assert "spec.flows: cannot change once the flow has started (phase Running)" \
        in decision.message
    # Before it starts, a change is validated like a create.
    pending = jobflow(CHAIN, phase="Pending")
    changed = copy.deepcopy(pending)
    changed["spec"]["flows"].append({"name": "train", "dependsOn": {"targets": ["c"]}})
    assert check(changed, operation="UPDATE", old=pending).allowed


def test_metadata_updates_are_allowed_even_for_a_broken_flow() -> None:
    """Deleting a flow (finalizers) must never be blocked by its spec."""
    broken = jobflow([{"name": "a", "dependsOn": {"targets": ["a"]}}], phase="Failed")
    relabelled = copy.deepcopy(broken)
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert check(relabelled, operation="UPDATE", old=broken).allowed
    assert not check(broken).allowed


def test_denied_while_templates_are_not_loaded() -> None:
    store = make_store()
    store.synced_kinds.discard("JobTemplate")
    decision = check(jobflow(CHAIN), store)
    assert not decision.allowed and decision.code == 503


def test_endpoint_is_registered() -> None:
    endpoint = BY_PATH["/webhook/validate/jobflows"]
    assert endpoint.kind == "JobFlow" and not endpoint.mutating
