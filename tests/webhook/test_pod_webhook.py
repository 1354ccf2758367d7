"""Pod decisions: queue label, admission gate, denials, gate protection."""

from __future__ import annotations

from arbiter.cache.store import ClusterStore
from tests.webhook.admission_samples import (
    ADMISSION_GATE,
    ARBITER_USER,
    JOB_CONTROLLER,
    QUEUE_LABEL,
    Json,
    env_for,
    gates,
    held,
    job,
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


def _store(jobs: list[Json] | None = None) -> ClusterStore:
    return make_store(
        queues=[queue_obj("team-a", namespaces=["team-a"]), queue_obj("gpu"),
                queue_obj("closed", state="Closed")],
        namespaces=[namespace_obj("team-a"), namespace_obj("team-b", {QUEUE_LABEL: "gpu"}),
                    namespace_obj("lonely"),
                    namespace_obj("optout", {"arbiter.dev/managed": "false"}),
                    namespace_obj("shut", {QUEUE_LABEL: "closed"})],
        jobs=jobs,
    )


def _managed_job(name: str, namespace: str, queue: str | None = "team-a") -> Json:
    """A Job as the cache holds it once the Job webhook labelled it (uid set)."""
    labels = {QUEUE_LABEL: queue} if queue else None
    return job(name, namespace, labels=labels, template_labels=labels, validating=True)


def _pod_of(owner: Json, queue: str = "team-a") -> Json:
    meta = owner["metadata"]
    return job_pod(meta["name"], meta["namespace"], queue=queue, job_uid=meta["uid"])


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
    train = _managed_job("train", "team-a")
    pod = _pod_of(train)
    request = parse(review("Pod", "CREATE", pod, user=JOB_CONTROLLER))
    assert request.name == ""  # generateName: no name on a mutating CREATE
    decision = pods.mutate(request, env_for(_store([train])))
    assert decision.allowed and decision.patch == ()


def test_pod_claiming_a_job_arbiter_does_not_hold_is_gated() -> None:
    """The owner reference and the queue label are the pod's own claims: a pod
    is let through ungated only for a managed Job the cache knows, same uid."""
    train = _managed_job("train", "team-a")
    legacy = _managed_job("legacy", "team-a", queue=None)
    store = _store([train, legacy])
    no_uid = _pod_of(train)
    no_uid["metadata"]["ownerReferences"][0]["uid"] = ""
    for what, pod in {"no uid": no_uid, "an unmanaged Job": _pod_of(legacy)}.items():
        result = patched(pod, pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(store)))
        assert gates(result) == [ADMISSION_GATE], what


def test_a_pod_of_a_job_the_cache_has_not_seen_is_refused_until_it_has() -> None:
    """A Job let through at creation makes its pods before its watch event
    reaches the cache: gated, such a pod would be queued a second time as a
    plain pod beside its admitted Job (the crash test saw `pod-j08-…` admitted
    next to `job-j08`). A retryable denial, by uid, until the cache has it; a
    forged claim stays refused."""
    train = _managed_job("train", "team-a")
    store = _store([train])
    unseen = {
        "no such Job yet": job_pod("fresh", "team-a", queue="team-a"),
        "a newer Job of a known name": job_pod("train", "team-a", queue="team-a"),
        "a Job of another namespace": _pod_of(train) | {"metadata": {
            **_pod_of(train)["metadata"], "namespace": "team-b"}},
    }
    for what, pod in unseen.items():
        for decide in (pods.mutate, pods.validate):
            decision = decide(parse(review("Pod", "CREATE", pod, user=JOB_CONTROLLER)),
                              env_for(store))
            assert not decision.allowed and decision.code == 503, what
            assert "has not seen it yet" in decision.message, what
    fresh = unseen["no such Job yet"]
    fresh_job = _managed_job("fresh", "team-a")
    fresh_job["metadata"]["uid"] = fresh["metadata"]["ownerReferences"][0]["uid"]
    fresh_job["spec"]["suspend"] = False  # let through at creation
    seen = _store([train, fresh_job])
    decision = pods.mutate(parse(review("Pod", "CREATE", fresh, user=JOB_CONTROLLER)),
                           env_for(seen))
    assert decision.allowed and gates(patched(fresh, decision)) == []


def test_validate_checks_the_queue_of_a_pod_of_a_job_arbiter_does_not_hold() -> None:
    legacy = _managed_job("legacy", "shut", queue=None)
    pod = _pod_of(legacy, queue="closed")
    decision = pods.validate(parse(review("Pod", "CREATE", pod)), env_for(_store([legacy])))
    assert not decision.allowed and "is Closed" in decision.message


def test_job_pods_wait_for_the_cache_to_list_jobs() -> None:
    # Gating a real Job's pod by mistake would hold it for good: retry instead.
    train = _managed_job("train", "team-a")
    store = _store([train])
    store.synced_kinds.discard("Job")
    request = parse(review("Pod", "CREATE", _pod_of(train)))
    for decide in (pods.mutate, pods.validate):
        decision = decide(request, env_for(store))
        assert not decision.allowed and decision.code == 503 and "Job" in decision.message
    plain = kubectl_run_pod("web", "team-a")  # claims no Job: decided as before
    assert gates(patched(plain, pods.mutate(parse(review("Pod", "CREATE", plain)),
                                            env_for(store)))) == [ADMISSION_GATE]


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


def test_pod_bound_to_a_node_is_labelled_not_gated_and_denied() -> None:
    pod = kubectl_run_pod("pinned", "team-a")
    pod["spec"]["nodeName"] = "node-1"
    decision = pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(_store()))
    # The apiserver refuses a gate on a bound pod: validation says no instead.
    result = patched(pod, decision)
    assert gates(result) == [] and result["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    denied = pods.validate(parse(review("Pod", "CREATE", result)), env_for(_store()))
    assert not denied.allowed
    assert denied.message.startswith('pod "team-a/pinned": spec.nodeName is set')


def test_validate_denies_namespace_without_queue_with_fix() -> None:
    pod = kubectl_run_pod("web", "lonely", validating=True)
    decision = pods.validate(parse(review("Pod", "CREATE", pod)), env_for(_store()))
    assert not decision.allowed and decision.code == 403
    assert decision.message == (
        'namespace "lonely" has no queue: label the pod or namespace with '
        'arbiter.dev/queue=<queue>, or list "lonely" in a Queue\'s spec.namespaces; '
        'it may use "gpu"'  # the open queues ("closed" is Closed)
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
    pod = held(kubectl_run_pod("web", "team-a", labels={QUEUE_LABEL: "team-a"},
                               validating=True))
    assert pods.validate(parse(review("Pod", "CREATE", pod)), env_for(_store())).allowed


def test_validate_allows_job_pods_of_a_closed_queue() -> None:
    # Closing a queue stops new work, not the pods of Jobs it already admitted.
    train = _managed_job("train", "shut", queue="closed")
    pod = _pod_of(train, queue="closed")
    assert pods.validate(parse(review("Pod", "CREATE", pod)), env_for(_store([train]))).allowed


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


def test_two_replicas_one_still_loading_never_pass_an_ungated_pod() -> None:
    """As for Jobs (test_job_webhook): mutated by a replica still loading,
    validated by a loaded one, a pod was let through ungated and denied."""
    loading = _store()
    loading.synced_kinds.discard("Namespace")
    refused = pods.mutate(parse(review("Pod", "CREATE", kubectl_run_pod("web", "team-a"))),
                          env_for(loading))
    assert not refused.allowed and refused.code == 503
    # A replica whose Queue watch lags gates it all the same, unlabelled.
    lagging = make_store(namespaces=[namespace_obj("team-a")])
    pod = kubectl_run_pod("web", "team-a")
    result = patched(pod, pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(lagging)))
    assert gates(result) == [ADMISSION_GATE]
    assert QUEUE_LABEL not in result["metadata"]["labels"]
    result["metadata"]["uid"] = "5e0d-web"
    assert pods.validate(parse(review("Pod", "CREATE", result)), env_for(_store())).allowed
