"""The owner walk in the Job and pod webhooks: a JobSet's Jobs follow their
JobSet's unit (no unit, no suspend of their own once it is admitted; the
deadlock of issue #28), pods of held workloads stay gated, and no tenant
forges its way out (unknown uids, unheld owners, rewritten ownerRefs)."""

from __future__ import annotations

import copy

from arbiter.cache.store import ClusterStore
from tests.webhook.admission_samples import (
    JOB_CONTROLLER,
    QUEUE_LABEL,
    TENANT,
    Json,
    env_for,
    gates,
    job,
    job_pod,
    parse,
    patched,
    queue_obj,
    review,
)
from tests.webhook.workload_samples import (
    QUEUED,
    ask,
    cache,
    child_pod,
    held_store,
    jobset,
    owned_by,
    statefulset,
    workload_unit,
)
from webhook import pods
from webhook.review import Decision

JOBSET_CONTROLLER = {"username": "system:serviceaccount:jobset-system:jobset-controller"}
ROOT = jobset("train", labels=QUEUED, suspend=True, validating=True)


def _store(*objects: Json, phase: str | None = None, root: Json = ROOT) -> ClusterStore:
    """A store holding `root` (a JobSet in queue team-a), its unit in
    `phase` (none when None), and `objects`."""
    return held_store(root, *objects, queues=[queue_obj("team-a", namespaces=["team-a"]),
                                              queue_obj("closed", state="Closed")],
                      namespaces=["team-a"],
                      units=[] if phase is None else [workload_unit(root, phase)])


def _child_job(name: str = "train-workers-0", *, suspend: bool | None = True,
               queue: str | None = "team-a", owner: Json = ROOT) -> Json:
    labels = {QUEUE_LABEL: queue} if queue else None
    obj = job(name, "team-a", labels=labels, suspend=suspend, template_labels=labels,
              validating=True)
    return owned_by(obj, owner)


def _job_decision(decide: str, operation: str, obj: Json, store: ClusterStore, *,
                  old: Json | None = None, user: Json | None = None) -> Decision:
    return ask(f"/webhook/{decide}/jobs", operation, obj, store, old=old,
               user=user or JOBSET_CONTROLLER)


# -- Jobs of a JobSet --------------------------------------------------------------------
def test_a_child_job_of_a_waiting_jobset_is_created_suspended_in_its_queue() -> None:
    obj = _child_job(suspend=False, queue=None)
    result = patched(obj, _job_decision("mutate", "CREATE", obj, _store(phase="Enqueued")))
    assert result["spec"]["suspend"] is True
    assert result["metadata"]["labels"] == QUEUED
    assert result["spec"]["template"]["metadata"]["labels"] == QUEUED


def test_a_child_job_of_an_admitted_jobset_is_not_suspended() -> None:
    obj = _child_job(suspend=False)
    decision = _job_decision("mutate", "CREATE", obj, _store(phase="Running"))
    assert patched(obj, decision)["spec"]["suspend"] is False
    assert _job_decision("validate", "CREATE", obj, _store(phase="Running")).allowed


def test_a_child_job_may_arrive_unsuspended_only_once_its_jobset_is_admitted() -> None:
    obj = _child_job(suspend=False)
    for phase in (None, "Enqueued", "Reserved"):
        decision = _job_decision("validate", "CREATE", obj, _store(phase=phase))
        assert not decision.allowed, phase
        assert decision.message == (
            'Job "team-a/train-workers-0" of JobSet "team-a/train" has spec.suspend false, but '
            'queue "team-a" has not admitted the JobSet yet: its Jobs are created suspended '
            "until kube-arbiter starts the JobSet")
    assert _job_decision("validate", "CREATE", _child_job(), _store(phase="Enqueued")).allowed


def test_a_child_job_needs_no_queue_check_of_its_own_nor_a_unit_slot() -> None:
    # Its JobSet's queue was checked when the JobSet was created; a restart
    # recreating its Jobs after the queue closed must not break it.
    root = jobset("train", labels={QUEUE_LABEL: "closed"}, suspend=False, validating=True)
    store = _store(phase="Running", root=root)
    store.units_per_namespace["team-a"] = 10_000
    obj = _child_job(suspend=False, queue="closed", owner=root)
    assert _job_decision("validate", "CREATE", obj, store).allowed
    plain = job("other", "team-a", labels=QUEUED, suspend=True, validating=True)
    assert not _job_decision("validate", "CREATE", plain, store).allowed


def test_the_jobset_controller_unsuspends_its_jobs_once_the_jobset_is_admitted() -> None:
    # Issue #28: the Job's own unit was looked up, which never exists: deadlock.
    old = _child_job()
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = False
    assert _job_decision("validate", "UPDATE", new, _store(phase="Dequeued"), old=old).allowed
    held = _job_decision("validate", "UPDATE", new, _store(phase="Enqueued"), old=old)
    assert not held.allowed
    assert held.message == (
        'Job "team-a/train-workers-0" belongs to JobSet "team-a/train", which is waiting for '
        'queue "team-a" to admit it: its Jobs may be unsuspended only once kube-arbiter starts '
        "the JobSet")


def test_a_unit_of_another_jobset_of_that_name_admits_no_child() -> None:
    stale = copy.deepcopy(ROOT)
    stale["metadata"]["uid"] = "the-deleted-jobsets-uid"
    store = _store()
    cache(store, workload_unit(stale, "Running"))
    old = _child_job()
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = False
    assert not _job_decision("validate", "UPDATE", new, store, old=old).allowed


def test_a_forged_or_unheld_owner_makes_a_job_no_child() -> None:
    unheld = jobset("plain", suspend=True, validating=True)  # no queue label
    store = _store(unheld, phase="Running")
    forged = _child_job(suspend=False)
    forged["metadata"]["ownerReferences"][0]["uid"] = "a-uid-nobody-has"
    for obj in (forged, _child_job(suspend=False, owner=unheld)):
        result = patched(obj, _job_decision("mutate", "CREATE", obj, store))
        assert result["spec"]["suspend"] is True  # held as a Job of its own
        denial = _job_decision("validate", "CREATE", obj, store, user=TENANT)
        assert not denial.allowed and "has spec.suspend false" in denial.message
        old = copy.deepcopy(obj)
        old["spec"]["suspend"] = True
        update = _job_decision("validate", "UPDATE", obj, store, old=old, user=TENANT)
        assert not update.allowed
        assert "only kube-arbiter may set spec.suspend to false" in update.message


def test_a_held_job_cannot_become_an_admitted_jobsets_child_by_an_update() -> None:
    store = _store(phase="Running")
    old = job("mine", "team-a", labels=QUEUED, suspend=True, template_labels=QUEUED,
              validating=True)
    decision = _job_decision("validate", "UPDATE", owned_by(old, ROOT), store, old=old,
                             user=TENANT)
    assert not decision.allowed
    assert decision.message.startswith(
        'Job "team-a/mine": metadata.ownerReferences cannot be changed to make it part of '
        'JobSet "team-a/train"')


# -- pods ------------------------------------------------------------------------------
def _pod_decision(decide: str, obj: Json, store: ClusterStore, *,
                  old: Json | None = None) -> Decision:
    operation = "CREATE" if old is None else "UPDATE"
    return ask(f"/webhook/{decide}/pods", operation, obj, store, old=old, user=JOB_CONTROLLER)


def test_a_pod_of_a_running_child_job_of_an_admitted_jobset_is_not_gated() -> None:
    child = _child_job(suspend=False)
    store = _store(child, phase="Running")
    obj = job_pod(child["metadata"]["name"], "team-a", queue="team-a",
                  job_uid=child["metadata"]["uid"])
    assert gates(patched(obj, _pod_decision("mutate", obj, store))) == []
    assert _pod_decision("validate", obj, store).allowed


def test_a_pod_of_a_child_job_unsuspended_while_its_jobset_waits_is_refused() -> None:
    # The Job escaped its JobSet's hold (say the webhook was down): its pods do not.
    child = _child_job(suspend=False)
    store = _store(child, phase="Enqueued")
    obj = job_pod(child["metadata"]["name"], "team-a", queue="team-a",
                  job_uid=child["metadata"]["uid"])
    for decide in ("mutate", "validate"):
        decision = _pod_decision(decide, obj, store)
        assert not decision.allowed
        assert 'has not admitted JobSet "team-a/train" yet' in decision.message


def test_pods_of_a_held_statefulset_are_gated_and_need_no_unit_slot() -> None:
    sts = statefulset("db", labels=QUEUED, validating=True)
    store = _store(sts)
    cache(store, workload_unit(sts, "Running"))
    store.units_per_namespace["team-a"] = 10_000
    obj = child_pod("db-0", sts, gated=False)
    assert gates(patched(obj, _pod_decision("mutate", obj, store))) == ["arbiter.dev/admission"]
    assert _pod_decision("validate", child_pod("db-0", sts), store).allowed
    plain = child_pod("other", sts)
    del plain["metadata"]["ownerReferences"]
    assert not _pod_decision("validate", plain, store).allowed


def test_a_held_pod_cannot_join_a_held_workload_by_an_update() -> None:
    sts = statefulset("db", labels=QUEUED, validating=True)
    store = _store(sts)
    old = child_pod("mine", sts)
    del old["metadata"]["ownerReferences"]
    decision = pods.validate(parse(review("Pod", "UPDATE", owned_by(old, sts), old=old,
                                          user=TENANT)), env_for(store))
    assert not decision.allowed
    assert 'cannot be changed to make it part of StatefulSet "team-a/db"' in decision.message
    # An adoption by a controller of no held workload (a ReplicaSet) is fine.
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
          "metadata": {"name": "web-1", "namespace": "team-a", "uid": "rs-uid"}}
    assert pods.validate(parse(review("Pod", "UPDATE", owned_by(old, rs), old=old,
                                      user=TENANT)), env_for(store)).allowed
