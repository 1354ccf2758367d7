"""The integrations' workloads at the door (webhook/workloads.py): labelled
with their queue (every template), JobSets suspended, children of a held
workload passed untouched (by uid only), queue and suspend guarded on
update, nothing done for a kind switched off."""

from __future__ import annotations

import copy

import pytest

from arbiter.cache.store import ClusterStore
from arbiter.integrations import OPTIONAL
from tests.webhook.admission_samples import (
    QUEUE_LABEL,
    TENANT,
    Json,
    env_for,
    make_store,
    namespace_obj,
    parse,
    patched,
    queue_obj,
    review,
)
from tests.webhook.workload_samples import (
    ARBITER,
    QUEUED,
    deployment,
    held_store,
    jobset,
    lws,
    owned_by,
    statefulset,
    switch_on,
    workload_unit,
)
from webhook import workloads
from webhook.endpoints import BY_PATH
from webhook.review import Decision


def _store(*objects: Json, units: list[Json] | None = None) -> ClusterStore:
    return held_store(*objects, queues=[queue_obj("team-a", namespaces=["team-a"]),
                                        queue_obj("gpu"), queue_obj("closed", state="Closed")],
                      namespaces=["team-a", "lonely"], units=units)


def _mutate(obj: Json, store: ClusterStore) -> Decision:
    return workloads.mutate(parse(review(obj["kind"], "CREATE", obj)), env_for(store))


def _create(obj: Json, store: ClusterStore, user: Json | None = None) -> Decision:
    return workloads.validate(parse(review(obj["kind"], "CREATE", obj, user=user or TENANT)),
                              env_for(store))


def _update(old: Json, new: Json, store: ClusterStore, user: Json | None = None) -> Decision:
    return workloads.validate(parse(review(old["kind"], "UPDATE", new, old=old,
                                           user=user or TENANT)), env_for(store))


# -- mutating CREATE ----------------------------------------------------------------
def test_a_jobset_is_labelled_everywhere_and_suspended() -> None:
    obj = jobset("train")
    result = patched(obj, _mutate(obj, _store()))
    assert result["metadata"]["labels"] == QUEUED
    assert result["spec"]["suspend"] is True
    for job in result["spec"]["replicatedJobs"]:
        # The Job template (its Jobs) and the pod template (their pods).
        assert job["template"]["metadata"]["labels"] == QUEUED
        assert job["template"]["spec"]["template"]["metadata"]["labels"] == QUEUED


def test_a_jobset_created_unsuspended_is_suspended_and_one_without_spec_gets_one() -> None:
    obj = jobset("train", suspend=False)
    assert patched(obj, _mutate(obj, _store()))["spec"]["suspend"] is True
    bare = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "bare", "namespace": "team-a"}}
    assert patched(bare, _mutate(bare, _store()))["spec"] == {"suspend": True}


@pytest.mark.parametrize("make", [statefulset, deployment])
def test_gate_held_and_per_pod_kinds_get_the_label_on_their_template_only(make: object) -> None:
    obj = make("web")  # type: ignore[operator]
    result = patched(obj, _mutate(obj, _store()))
    assert result["metadata"]["labels"] == QUEUED
    assert result["spec"]["template"]["metadata"]["labels"] == {"app": "web", **QUEUED}
    assert "suspend" not in result["spec"]


def test_an_lws_labels_leader_and_worker_templates() -> None:
    obj = lws("serve", labels={QUEUE_LABEL: "gpu"})
    gpu = make_store(queues=[queue_obj("gpu")], namespaces=[namespace_obj("team-a")])
    result = patched(obj, _mutate(obj, switch_on(gpu)))
    templates = result["spec"]["leaderWorkerTemplate"]
    assert templates["leaderTemplate"]["metadata"]["labels"] == {QUEUE_LABEL: "gpu"}
    assert templates["workerTemplate"]["metadata"]["labels"] == {QUEUE_LABEL: "gpu"}


def test_a_kind_switched_off_passes_untouched() -> None:
    store = _store()
    store.integrations = ()
    obj = jobset("train", namespace="lonely", suspend=False, validating=True)
    assert _mutate(obj, store).patch == ()
    assert _create(obj, store).allowed
    switch_on(store, "statefulset")
    assert _mutate(obj, store).patch == () and _create(obj, store).allowed
    assert _mutate(statefulset("db"), store).patch != ()


def test_unmanaged_namespaces_pass_and_unresolvable_queues_are_held_for_validation() -> None:
    assert _mutate(jobset("x", namespace="kube-system"), _store()).patch == ()
    # Suspended, not labelled: the validating call may reach another
    # replica whose cache knows a queue for it (jobs.mutate).
    ops = _mutate(jobset("x", namespace="lonely"), _store()).patch
    assert [op["path"] for op in ops] == ["/spec/suspend"]
    loading = _store()
    loading.synced_kinds.discard("Namespace")
    refused = _mutate(jobset("x"), loading)
    assert not refused.allowed and refused.code == 503


# -- children: by uid, never by name ---------------------------------------------------
def test_the_statefulsets_of_a_held_lws_pass_untouched() -> None:
    root = lws("serve", labels=QUEUED, validating=True)
    store = _store(root)
    # Its leader StatefulSet: a leader pod per group.
    child = owned_by(statefulset("serve", namespace="team-a", replicas=2, validating=True), root)
    assert _mutate(child, store).patch == ()
    # No queue of its own needed (the LWS's was checked), in any namespace state.
    store.queue_by_namespace.clear()
    assert _create(child, store).allowed


def test_a_forged_or_unheld_owner_counts_for_nothing() -> None:
    unheld = lws("plain", validating=True)  # no queue label: arbiter holds nothing
    store = _store(unheld)
    forged = statefulset("db", validating=True)
    forged["metadata"]["ownerReferences"] = [{
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "name": "serve", "uid": "not-a-uid-the-cache-knows", "controller": True}]
    for obj in (forged, owned_by(statefulset("db2", validating=True), unheld)):
        result = patched(obj, _mutate(obj, store))
        assert result["metadata"]["labels"] == QUEUED  # held as its own workload
        lonely = copy.deepcopy(obj)
        lonely["metadata"]["namespace"] = "lonely"
        denial = _create(lonely, store)
        assert not denial.allowed and 'namespace "lonely" has no queue' in denial.message


def test_an_owner_of_the_right_uid_but_another_kind_or_namespace_counts_for_nothing() -> None:
    root = lws("serve", labels=QUEUED, validating=True)
    store = _store(root)
    child = owned_by(statefulset("serve", validating=True), root)
    child["metadata"]["ownerReferences"][0]["kind"] = "JobSet"
    assert _mutate(child, store).patch != ()
    elsewhere = owned_by(statefulset("serve", namespace="lonely", validating=True), root)
    assert not _create(elsewhere, store).allowed


# -- validating CREATE ----------------------------------------------------------------
def test_a_deployment_without_a_queue_is_refused_naming_the_namespace_and_the_fix() -> None:
    decision = _create(deployment("web", namespace="lonely", validating=True), _store())
    assert not decision.allowed
    assert decision.message.startswith(
        'namespace "lonely" has no queue: label the Deployment or namespace with '
        f"{QUEUE_LABEL}=<queue>")
    closed = _create(deployment("web", labels={QUEUE_LABEL: "closed"}, validating=True),
                     _store())
    assert not closed.allowed and "is Closed" in closed.message


def test_dra_claims_in_any_template_are_refused_with_the_field() -> None:
    obj = jobset("train", labels=QUEUED, suspend=True, validating=True)
    obj["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"][
        "resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu"}]
    decision = _create(obj, _store())
    assert not decision.allowed
    assert decision.message.startswith(
        'JobSet "team-a/train": spec.replicatedJobs[1].template.spec.template.spec'
        ".resourceClaims: kube-arbiter cannot charge")


def test_a_jobset_arriving_unsuspended_is_refused_unless_arbiter_sends_it() -> None:
    obj = jobset("train", labels=QUEUED, suspend=False, validating=True)
    decision = _create(obj, _store())
    assert not decision.allowed
    assert "has spec.suspend false" in decision.message
    assert _create(obj, _store(), ARBITER).allowed
    assert _create(jobset("ok", labels=QUEUED, suspend=True, validating=True), _store()).allowed
    # A gate-held kind has no suspend field: its pods are gated.
    assert _create(statefulset("db", labels=QUEUED, validating=True), _store()).allowed


# -- validating UPDATE ----------------------------------------------------------------
def test_the_queue_label_cannot_be_removed() -> None:
    old = statefulset("db", labels=QUEUED, validating=True)
    new = copy.deepcopy(old)
    del new["metadata"]["labels"]
    decision = _update(old, new, _store(old))
    assert not decision.allowed
    assert "the arbiter.dev/queue label cannot be removed" in decision.message


def _moved(obj: Json, queue: str) -> Json:
    new = copy.deepcopy(obj)
    new["metadata"]["labels"][QUEUE_LABEL] = queue
    return new


def test_a_waiting_workload_may_move_to_a_usable_queue_only() -> None:
    old = lws("serve", labels=QUEUED, validating=True)
    store = _store(old, units=[workload_unit(old, "Enqueued", "0")])
    assert _update(old, _moved(old, "gpu"), store).allowed
    closed = _update(old, _moved(old, "closed"), store)
    assert not closed.allowed and "is Closed" in closed.message


def test_an_admitted_workload_cannot_move_whichever_of_its_units_is_admitted() -> None:
    old = lws("serve", labels=QUEUED, validating=True)
    store = _store(old, units=[workload_unit(old, "Enqueued", "0"),
                               workload_unit(old, "Running", "1")])
    decision = _update(old, _moved(old, "gpu"), store)
    assert not decision.allowed
    assert decision.message == (
        'LeaderWorkerSet "team-a/serve" was admitted by queue "team-a" and cannot move to '
        'queue "gpu"; delete and recreate it to run in another queue')


def test_a_unit_left_by_another_workload_of_that_name_admits_nothing() -> None:
    old = statefulset("db", labels=QUEUED, validating=True)
    stale = copy.deepcopy(old)
    stale["metadata"]["uid"] = "the-deleted-statefulsets-uid"
    store = _store(old, units=[workload_unit(stale, "Running")])
    assert _update(old, _moved(old, "gpu"), store).allowed


def test_replicas_may_change_while_admitted() -> None:
    old = statefulset("db", labels=QUEUED, validating=True)
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 5
    assert _update(old, new, _store(old, units=[workload_unit(old, "Running")])).allowed


def _unsuspended(obj: Json) -> Json:
    new = copy.deepcopy(obj)
    new["spec"]["suspend"] = False
    return new


def test_only_arbiter_or_an_admitted_unit_unsuspends_a_jobset() -> None:
    old = jobset("train", labels=QUEUED, suspend=True, validating=True)
    waiting = _store(old, units=[workload_unit(old, "Enqueued")])
    decision = _update(old, _unsuspended(old), waiting)
    assert not decision.allowed
    assert decision.message == ('JobSet "team-a/train" is waiting for queue "team-a" to admit '
                                "it: only kube-arbiter may set spec.suspend to false")
    assert _update(old, _unsuspended(old), waiting, ARBITER).allowed
    admitted = _store(old, units=[workload_unit(old, "Dequeued")])
    assert _update(old, _unsuspended(old), admitted).allowed


def test_a_running_jobset_cannot_move_even_without_its_unit_in_the_cache() -> None:
    old = jobset("train", labels=QUEUED, suspend=False, validating=True)
    decision = _update(old, _moved(old, "gpu"), _store(old))
    assert not decision.allowed and "was admitted by queue" in decision.message


def test_claims_cannot_be_added_by_an_update() -> None:
    old = deployment("web", labels=QUEUED, validating=True)
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["resourceClaims"] = [{"name": "x"}]
    decision = _update(old, new, _store(old))
    assert not decision.allowed
    assert "spec.template.spec.resourceClaims" in decision.message


def test_a_workload_cannot_take_a_held_workload_as_its_controller() -> None:
    root = lws("serve", labels=QUEUED, validating=True)
    old = statefulset("db", labels=QUEUED, validating=True)
    store = _store(root, old, units=[workload_unit(root, "Running", "0")])
    decision = _update(old, owned_by(old, root), store)
    assert not decision.allowed
    assert decision.message.startswith(
        'StatefulSet "team-a/db": metadata.ownerReferences cannot be changed to make it part '
        'of LeaderWorkerSet "team-a/serve"')
    # A child keeps its owner: its root's controller updates it freely.
    child = owned_by(statefulset("serve", labels=QUEUED, validating=True), root)
    assert _update(child, _moved(child, "gpu"), store).allowed


def test_updates_of_workloads_arbiter_does_not_manage_pass() -> None:
    old = statefulset("db", validating=True)
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 9
    assert _update(old, new, _store(old)).allowed


# -- the table and the configurations ---------------------------------------------------
def test_every_optional_integration_has_its_endpoints_and_hooks() -> None:
    for integration in OPTIONAL:
        mutate = BY_PATH[f"/webhook/mutate/{integration.resource}"]
        validate = BY_PATH[f"/webhook/validate/{integration.resource}"]
        assert (mutate.group, mutate.kind, mutate.version) == (
            integration.group, integration.kind, integration.version)
        assert mutate.hooks[0].operations == ("CREATE",)
        assert validate.hooks[0].operations == ("CREATE", "UPDATE")
        assert validate.hooks[0].condition is not None
        assert validate.hooks[0].condition[0] == "managed-by-arbiter"


def test_limits_apply_to_workloads_but_not_to_the_children_of_held_ones() -> None:
    root = lws("serve", labels=QUEUED, validating=True)
    store = _store(root)
    store.units_per_namespace["team-a"] = 10
    env = env_for(store)
    full = type(env)(store=store, own_usernames=env.own_usernames, max_units_per_namespace=10)
    validate = BY_PATH["/webhook/validate/statefulsets"].decide
    own = statefulset("db", labels=QUEUED, validating=True)
    denial = validate(parse(review("StatefulSet", "CREATE", own, user=TENANT)), full)
    assert not denial.allowed and "holds 10 QueueUnits" in denial.message
    child = owned_by(statefulset("serve", replicas=2, validating=True), root)
    assert validate(parse(review("StatefulSet", "CREATE", child, user=TENANT)), full).allowed
    wide = statefulset("wide", labels=QUEUED, validating=True)
    wide["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = {
        f"example.com/r{i}": "1" for i in range(20)}
    names = validate(parse(review("StatefulSet", "CREATE", wide, user=TENANT)), env)
    assert not names.allowed and "its pod templates' specs names 20 resources" in names.message


def test_an_unreadable_spec_is_answered_not_crashed_on() -> None:
    old = lws("serve", labels=QUEUED, validating=True)
    old["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "resources"] = {"requests": {"cpu": "lots"}}
    store = _store(old, units=[workload_unit(old, "Enqueued", "0")])
    assert old["metadata"]["uid"] not in store.owners.links  # the cache skipped it too
    assert _update(old, _moved(old, "gpu"), store).allowed
    closed = _update(old, _moved(old, "closed"), store)
    assert not closed.allowed and "is Closed" in closed.message



def test_a_workload_arbiter_cannot_read_is_refused_with_what_it_reads() -> None:
    """A spec the loop cannot make units of (9 replicatedJobs, 2,000 LWS
    groups) would wait held for ever without a word: refused at the door."""
    obj = jobset("wide", labels=QUEUED, suspend=True, validating=True)
    first = obj["spec"]["replicatedJobs"][0]
    obj["spec"]["replicatedJobs"] = [dict(first, name=f"j{i}") for i in range(9)]
    decision = _create(obj, _store())
    assert not decision.allowed
    assert "1 to 8 replicated Jobs" in decision.message
    many = lws("serve", labels=QUEUED, validating=True)
    many["spec"]["replicas"] = 2000
    decision = _create(many, _store())
    assert not decision.allowed and "at most 1000 groups" in decision.message
