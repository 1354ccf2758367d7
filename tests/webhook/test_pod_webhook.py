"""Pod decisions: queue label, admission gate, denials, gate protection."""

from __future__ import annotations

from arbiter.cache.store import ClusterStore
from tests.webhook.admission_samples import (
    ADMISSION_GATE,
    ARBITER_USER,
    JOB_CONTROLLER,
    QUEUE_LABEL,
    env_for,
    gates,
    job_pod,
    kubectl_run_pod,
    make_store,
    namespace_obj,
    parse,
    patched,
    queue_obj,
    review,
)
from webhook import pods


def _store() -> ClusterStore:
    return make_store(
        queues=[queue_obj("team-a", namespaces=["team-a"]), queue_obj("gpu"),
                queue_obj("closed", state="Closed")],
        namespaces=[namespace_obj("team-a"), namespace_obj("team-b", {QUEUE_LABEL: "gpu"}),
                    namespace_obj("lonely"),
                    namespace_obj("optout", {"arbiter.dev/managed": "false"}),
                    namespace_obj("shut", {QUEUE_LABEL: "closed"})],
    )


def test_mutate_labels_and_gates_pod_in_listed_namespace() -> None:
    pod = kubectl_run_pod("web", "team-a")
    decision = pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(_store()))
    assert decision.allowed
    result = patched(pod, decision)
    assert result["metadata"]["labels"] == {"run": "web", QUEUE_LABEL: "team-a"}
    assert gates(result) == [ADMISSION_GATE]
    assert {"op": "add", "path": "/metadata/labels/arbiter.dev~1queue", "value": "team-a"} in \
        decision.patch


def test_mutate_adds_whole_labels_map_when_absent() -> None:
    pod = kubectl_run_pod("bare", "team-b", labels={})
    assert "labels" not in pod["metadata"]
    decision = pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(_store()))
    assert decision.patch[0] == {"op": "add", "path": "/metadata/labels",
                                 "value": {QUEUE_LABEL: "gpu"}}
    assert patched(pod, decision)["metadata"]["labels"] == {QUEUE_LABEL: "gpu"}


def test_mutate_appends_to_existing_gates() -> None:
    pod = kubectl_run_pod("web", "team-a")
    pod["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    decision = pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(_store()))
    assert gates(patched(pod, decision)) == ["example.com/other", ADMISSION_GATE]


def test_mutate_keeps_explicit_queue_label_and_does_not_duplicate_gate() -> None:
    pod = kubectl_run_pod("web", "team-a", labels={QUEUE_LABEL: "gpu"})
    pod["spec"]["schedulingGates"] = [{"name": ADMISSION_GATE}]
    decision = pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(_store()))
    assert decision.allowed and decision.patch == ()


def test_pod_group_members_are_gated_like_single_pods() -> None:
    pod = kubectl_run_pod("worker-0", "team-a", labels={"arbiter.dev/pod-group": "train"})
    result = patched(pod, pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(_store())))
    assert gates(result) == [ADMISSION_GATE]
    assert result["metadata"]["labels"]["arbiter.dev/pod-group"] == "train"


def test_labelled_pod_of_a_job_is_not_gated() -> None:
    pod = job_pod("train", "team-a", queue="team-a")
    request = parse(review("Pod", "CREATE", pod, user=JOB_CONTROLLER))
    assert request.name == ""  # generateName: no name on a mutating CREATE
    decision = pods.mutate(request, env_for(_store()))
    assert decision.allowed and decision.patch == ()


def test_unlabelled_pod_of_a_job_is_gated() -> None:
    # A Job created before arbiter managed the namespace: its pods are units.
    pod = job_pod("legacy", "team-a", queue=None)
    result = patched(pod, pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(_store())))
    assert gates(result) == [ADMISSION_GATE]
    assert result["metadata"]["labels"][QUEUE_LABEL] == "team-a"


def test_pod_owned_by_a_non_controller_job_reference_is_gated() -> None:
    pod = job_pod("train", "team-a", queue="team-a")
    pod["metadata"]["ownerReferences"][0]["controller"] = False
    result = patched(pod, pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(_store())))
    assert gates(result) == [ADMISSION_GATE]


def test_unmanaged_namespaces_are_never_touched() -> None:
    store = _store()
    for namespace in ("kube-system", "arbiter-system", "optout"):
        pod = kubectl_run_pod("x", namespace)
        request = parse(review("Pod", "CREATE", pod))
        assert pods.mutate(request, env_for(store)).patch == ()
        valid = kubectl_run_pod("x", namespace, validating=True)
        assert pods.validate(parse(review("Pod", "CREATE", valid)), env_for(store)).allowed


def test_pod_bound_to_a_node_is_labelled_not_gated() -> None:
    pod = kubectl_run_pod("pinned", "team-a")
    pod["spec"]["nodeName"] = "node-1"
    decision = pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(_store()))
    assert gates(patched(pod, decision)) == []
    assert decision.warnings and "nodeName" in decision.warnings[0]


def test_validate_denies_namespace_without_queue_with_fix() -> None:
    pod = kubectl_run_pod("web", "lonely", validating=True)
    decision = pods.validate(parse(review("Pod", "CREATE", pod)), env_for(_store()))
    assert not decision.allowed and decision.code == 403
    assert decision.message == (
        'namespace "lonely" has no queue: label the pod or namespace with '
        'arbiter.dev/queue=<queue>, or list "lonely" in a Queue\'s spec.namespaces'
    )


def test_validate_denies_unknown_queue_naming_its_source() -> None:
    pod = kubectl_run_pod("web", "team-a", labels={QUEUE_LABEL: "nope"}, validating=True)
    decision = pods.validate(parse(review("Pod", "CREATE", pod)), env_for(_store()))
    assert not decision.allowed
    assert decision.message.startswith(
        'queue "nope" (from the pod\'s arbiter.dev/queue label) does not exist')


def test_validate_denies_closed_queue() -> None:
    pod = kubectl_run_pod("web", "shut", labels={QUEUE_LABEL: "closed"}, validating=True)
    decision = pods.validate(parse(review("Pod", "CREATE", pod)), env_for(_store()))
    assert not decision.allowed and "is Closed" in decision.message
    assert "\n" not in decision.message


def test_validate_allows_open_queue() -> None:
    pod = kubectl_run_pod("web", "team-a", labels={QUEUE_LABEL: "team-a"}, validating=True)
    assert pods.validate(parse(review("Pod", "CREATE", pod)), env_for(_store())).allowed


def test_validate_allows_job_pods_of_a_closed_queue() -> None:
    # Closing a queue stops new work, not the pods of Jobs it already admitted.
    pod = job_pod("train", "shut", queue="closed")
    assert pods.validate(parse(review("Pod", "CREATE", pod)), env_for(_store())).allowed


def test_validate_waits_for_cache_sync() -> None:
    store = _store()
    store.synced_kinds.discard("Queue")
    pod = kubectl_run_pod("web", "team-a", labels={QUEUE_LABEL: "team-a"}, validating=True)
    decision = pods.validate(parse(review("Pod", "CREATE", pod)), env_for(store))
    assert not decision.allowed and decision.code == 503 and "Queue" in decision.message


def _held(name: str = "web") -> dict[str, object]:
    pod = kubectl_run_pod(name, "team-a", labels={QUEUE_LABEL: "team-a"}, validating=True)
    pod["spec"]["schedulingGates"] = [{"name": ADMISSION_GATE}]
    return pod


def test_user_may_not_remove_the_admission_gate() -> None:
    old = _held()
    new = _held()
    new["spec"]["schedulingGates"] = []  # type: ignore[index]
    decision = pods.validate(parse(review("Pod", "UPDATE", new, old=old)), env_for(_store()))
    assert not decision.allowed
    assert "only kube-arbiter may remove the arbiter.dev/admission" in decision.message


def test_arbiter_may_remove_the_admission_gate() -> None:
    old = _held()
    new = _held()
    del new["spec"]["schedulingGates"]  # type: ignore[attr-defined]
    request = parse(review("Pod", "UPDATE", new, old=old, user={"username": ARBITER_USER}))
    assert pods.validate(request, env_for(_store())).allowed


def test_held_pod_may_not_change_queue_but_may_gain_node_selector() -> None:
    old = _held()
    moved = _held()
    moved["metadata"]["labels"][QUEUE_LABEL] = "gpu"  # type: ignore[index]
    decision = pods.validate(parse(review("Pod", "UPDATE", moved, old=old)), env_for(_store()))
    assert not decision.allowed and "cannot change" in decision.message
    steered = _held()
    steered["spec"]["nodeSelector"] = {"zone": "a"}  # type: ignore[index]
    assert pods.validate(parse(review("Pod", "UPDATE", steered, old=old)),
                         env_for(_store())).allowed
