"""A declared kind at the door (webhook/workloads.py with a `Widget` made
from a declaration): its endpoints served and configured, labelled and
suspended at creation, refused without a usable queue or unsuspended by a
tenant, refused while its declaration is off; its pods' owner walk by uid."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from arbiter.cache.store import ClusterStore
from arbiter.integrations import BY_KIND
from arbiter.integrations.declared import DeclaredIntegration
from tests.integrations.declared_samples import registered, widget, with_changes
from tests.webhook import admission_samples
from tests.webhook.admission_samples import (
    QUEUE_LABEL,
    Json,
    kubectl_run_pod,
    make_store,
    namespace_obj,
    patched,
    queue_obj,
    unit_obj,
)
from tests.webhook.workload_samples import ARBITER, QUEUED, ask, owned_by
from webhook import configuration, queueunits
from webhook.configuration import desired_configurations
from webhook.endpoints import served

MUTATE, VALIDATE = "/webhook/mutate/widgets.example.com", "/webhook/validate/widgets.example.com"


@pytest.fixture
def kind(monkeypatch: pytest.MonkeyPatch) -> Iterator[DeclaredIntegration]:
    with registered() as (integration,):
        monkeypatch.setitem(admission_samples._GVR, "Widget", (
            {"group": "example.com", "version": "v1", "kind": "Widget"},
            {"group": "example.com", "version": "v1", "resource": "widgets"}))
        yield integration


def _store(kind: DeclaredIntegration, *objects: Json) -> ClusterStore:
    store = make_store(
        queues=[queue_obj("team-a", namespaces=["team-a"]), queue_obj("gpu", namespaces=["gpu"])],
        namespaces=[namespace_obj("team-a"), namespace_obj("lonely")])
    store.integrations = (kind,)
    for obj in objects:
        store.apply(obj["kind"], "ADDED", obj)
    return store


def test_its_endpoints_are_served_and_configured_while_it_is_declared() -> None:
    with registered() as (integration,):
        paths = [e.path for e in served()]
        assert MUTATE in paths and VALIDATE in paths
        mutating, validating = desired_configurations(url="https://x", excluded_namespaces=())
        rules = {w["name"]: w["rules"] for c in (mutating, validating) for w in c["webhooks"]}
        assert rules["widgets.example.com.mutate.arbiter.dev"] == [{
            "apiGroups": ["example.com"], "apiVersions": ["v1"], "resources": ["widgets"],
            "operations": ["CREATE"], "scope": "Namespaced"}]
        assert rules["widgets.example.com.validate.arbiter.dev"][0]["operations"] == \
            ["CREATE", "UPDATE"]
        assert configuration.OWN_WRITES_SKIP["widgets.example.com.validate.arbiter.dev"] == \
            "updates"
        assert "widget-" in queueunits.LOOP_PREFIXES  # a tenant's unit may not take it
        assert BY_KIND["Widget"] is integration
    assert MUTATE not in [e.path for e in served()] and "Widget" not in BY_KIND
    assert "widget-" not in queueunits.LOOP_PREFIXES


def test_it_is_labelled_in_every_template_and_suspended(kind: DeclaredIntegration) -> None:
    obj = widget("w", suspend=False)
    result = patched(obj, ask(MUTATE, "CREATE", obj, _store(kind)))
    assert result["metadata"]["labels"] == QUEUED
    assert result["spec"]["suspend"] is True
    for part in ("driver", "workers"):
        assert result["spec"][part]["template"]["metadata"]["labels"] == QUEUED


def test_it_is_refused_without_a_usable_queue_or_created_running(
        kind: DeclaredIntegration) -> None:
    store = _store(kind)
    lonely = widget("w", "lonely", suspend=True, uid="u1")
    denied = ask(VALIDATE, "CREATE", lonely, store)
    assert not denied.allowed and 'namespace "lonely" has no queue' in denied.message
    theirs = with_changes(widget("w", suspend=True, uid="u1"), "metadata", "labels",
                          {QUEUE_LABEL: "gpu"})
    denied = ask(VALIDATE, "CREATE", theirs, store)
    assert not denied.allowed and '"gpu"' in denied.message
    running = widget("w", suspend=False, queue="team-a", uid="u1")
    denied = ask(VALIDATE, "CREATE", running, store)
    assert not denied.allowed and "has spec.suspend false" in denied.message
    assert ask(VALIDATE, "CREATE", widget("w", suspend=True, queue="team-a", uid="u1"),
               store).allowed


def test_a_spec_it_cannot_count_is_refused_naming_what_is_read(kind: DeclaredIntegration) -> None:
    obj = with_changes(widget("w", suspend=True, queue="team-a", uid="u1"),
                       "spec", "workers", "count", "3")
    denied = ask(VALIDATE, "CREATE", obj, _store(kind))
    assert not denied.allowed
    assert "kube-arbiter queues a Widget with spec.driver.replicas a whole number" in \
        denied.message


def test_a_tenant_may_not_unsuspend_it_but_may_change_its_counts(
        kind: DeclaredIntegration) -> None:
    old = widget("w", suspend=True, queue="team-a", uid="u1")
    store = _store(kind, old)
    started = with_changes(old, "spec", "suspend", False)
    denied = ask(VALIDATE, "UPDATE", started, store, old=old)
    assert not denied.allowed
    assert "only kube-arbiter may set spec.suspend to false" in denied.message
    assert ask(VALIDATE, "UPDATE", started, store, old=old, user=ARBITER).allowed
    # The loop holds it again and queues it at the new size.
    grown = with_changes(old, "spec", "workers", "count", 5)
    assert ask(VALIDATE, "UPDATE", grown, store, old=old).allowed
    moved = with_changes(old, "metadata", "labels", {})
    assert "cannot be removed" in ask(VALIDATE, "UPDATE", moved, store, old=old).message


def test_while_its_declaration_is_off_it_is_refused_with_the_reason(
        kind: DeclaredIntegration) -> None:
    store = _store(kind)
    store.integrations = ()
    obj = widget("w", suspend=True, queue="team-a", uid="u1")
    denied = ask(VALIDATE, "CREATE", obj, store)
    assert not denied.allowed and "not switched on (its CRD is not checked yet)" in \
        denied.message
    store.declared_off["Widget"] = "refused: integrations[0].suspendPath: ..."
    assert "(refused: integrations[0].suspendPath: ...)" in \
        ask(VALIDATE, "CREATE", obj, store).message
    assert ask(MUTATE, "CREATE", obj, store).patch == ()
    assert ask(VALIDATE, "CREATE", widget("w", "kube-system", uid="u2"), store).allowed


def test_its_pods_reach_it_by_uid_only(kind: DeclaredIntegration) -> None:
    root = widget("w", suspend=True, queue="team-a", uid="widget-uid")
    store = _store(kind, root)
    pod = owned_by(kubectl_run_pod("w-driver-0", "team-a", labels=QUEUED, validating=True),
                   root)
    found = store.root_workload("team-a", "Widget", "widget-uid")
    assert found is not None and found.kind == "Widget" and found.unit_name() == "widget-w"
    assert found.units is not None and [ps.name for ps in found.units[0].pod_sets] == \
        ["driver", "workers"]
    forged = with_changes(pod, "metadata", "ownerReferences", 0, "uid", "other")
    assert store.root_workload("team-a", "Widget", "other") is None
    assert store.owner_pending("Widget", forged["metadata"]["ownerReferences"][0]["uid"])


def _unit(root: Json, phase: str, count: int = 3) -> Json:
    meta = root["metadata"]
    return unit_obj(f"widget-{meta['name']}", meta["namespace"], {
        "queue": "team-a",
        "consumerRef": {"apiVersion": root["apiVersion"], "kind": "Widget",
                        "namespace": meta["namespace"], "name": meta["name"],
                        "uid": meta["uid"]},
        "podSets": [{"name": "driver", "count": 1, "requests": {"cpu": "1"}},
                    {"name": "workers", "count": count - 1, "requests": {"cpu": "1"}}]},
        phase=phase)


def _pod(name: str, root: Json) -> Json:
    return owned_by(kubectl_run_pod(name, "team-a", labels=QUEUED, validating=True), root)


def test_its_controllers_pods_pass_ungated_only_while_admitted_and_within_its_count(
        kind: DeclaredIntegration) -> None:
    held = widget("w", suspend=True, queue="team-a", uid="widget-uid")
    store = _store(kind, held)
    store.apply("QueueUnit", "ADDED", _unit(held, "Enqueued"))
    pod = _pod("w-driver-0", held)
    denied = ask("/webhook/mutate/pods", "CREATE", pod, store)
    assert not denied.allowed and 'queue "team-a" has not admitted it yet' in denied.message

    running = with_changes(held, "spec", "suspend", False)
    store.apply(running["kind"], "MODIFIED", running)
    store.apply("QueueUnit", "MODIFIED", _unit(held, "Running"))
    let_in = ask("/webhook/mutate/pods", "CREATE", pod, store)
    assert let_in.allowed and "schedulingGates" not in str(patched(pod, let_in)["spec"])
    assert ask("/webhook/validate/pods", "CREATE", pod, store).allowed
    # A forged controller uid is nobody's: gated like a plain pod.
    forged = with_changes(pod, "metadata", "ownerReferences", 0, "uid", "other")
    gated = patched(forged, ask("/webhook/mutate/pods", "CREATE", forged, store))
    assert gated["spec"]["schedulingGates"] == [{"name": "arbiter.dev/admission"}]
    # Past the 3 pods admitted: a passenger.
    for index in range(3):
        store.apply("Pod", "ADDED", _pod(f"w-{index}", running))
    denied = ask("/webhook/mutate/pods", "CREATE", _pod("w-extra", running), store)
    assert not denied.allowed and "already has 3 active pods" in denied.message
