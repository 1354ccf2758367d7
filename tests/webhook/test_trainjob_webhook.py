"""TrainJobs at the door (webhook/workloads.py): labelled and suspended, the
queue checked and nothing more (its pods are its JobSet's, not known yet);
the JobSet Trainer makes, its Jobs and their pods pass as the TrainJob's
(by uid), suspended while it waits; a JobSet forging a reference to another
team's TrainJob passes nothing."""

from __future__ import annotations

import copy

from arbiter.cache.store import ClusterStore
from tests.webhook.admission_samples import (
    ARBITER_USER,
    JOB_CONTROLLER,
    QUEUE_LABEL,
    Json,
    env_for,
    job,
    object_meta,
    parse,
    patched,
    queue_obj,
    review,
)
from tests.webhook.workload_samples import (
    QUEUED,
    ask,
    cache,
    held_store,
    jobset,
    owned_by,
    switch_on,
    workload_unit,
)
from webhook import workloads
from webhook.review import Decision

TRAINER = {"username": "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"}


def trainjob(name: str = "tune", namespace: str = "team-a", *, labels: Json | None = None,
             suspend: bool | None = None, validating: bool = False) -> Json:
    spec: Json = {"runtimeRef": {"name": "torch-distributed",
                                 "apiGroup": "trainer.kubeflow.org",
                                 "kind": "ClusterTrainingRuntime"},
                  "trainer": {"numNodes": 2, "resourcesPerNode": {"requests": {"cpu": "1"}}},
                  "managedBy": "trainer.kubeflow.org/trainjob-controller"}
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": object_meta(name, namespace, labels, validating), "spec": spec}


ROOT = trainjob(labels=QUEUED, suspend=True, validating=True)


def trainers_jobset(owner: Json = ROOT, *, suspend: bool = True) -> Json:
    """The JobSet Trainer makes: named as the TrainJob, no queue label."""
    meta = owner["metadata"]
    return owned_by(jobset(meta["name"], meta["namespace"], suspend=suspend, validating=True,
                           jobs=(("node", 1),)), owner)


def _store(*objects: Json, phase: str | None = None) -> ClusterStore:
    return held_store(ROOT, *objects, queues=[queue_obj("team-a", namespaces=["team-a"]),
                                              queue_obj("team-b", namespaces=["team-b"])],
                      namespaces=["team-a", "team-b", "lonely"],
                      units=[] if phase is None else [workload_unit(ROOT, phase)])


def _decide(decide: str, operation: str, obj: Json, store: ClusterStore, *,
            old: Json | None = None, user: Json | None = None) -> Decision:
    plural = {"TrainJob": "trainjobs", "JobSet": "jobsets", "Job": "jobs"}[obj["kind"]]
    return ask(f"/webhook/{decide}/{plural}", operation, obj, store, old=old, user=user)


# -- the TrainJob ------------------------------------------------------------------------
def test_a_trainjob_is_labelled_and_created_suspended() -> None:
    obj = trainjob()
    result = patched(obj, _decide("mutate", "CREATE", obj, _store()))
    assert result["metadata"]["labels"] == QUEUED
    assert result["spec"]["suspend"] is True
    assert result["spec"]["trainer"] == obj["spec"]["trainer"]  # nothing else touched


def test_its_queue_is_checked_and_its_pods_are_not_asked_for() -> None:
    store = _store()
    # No pod template anywhere: its pods are its JobSet's, read later.
    assert _decide("validate", "CREATE", trainjob(labels=QUEUED, suspend=True,
                                                  validating=True), store).allowed
    lonely = _decide("validate", "CREATE", trainjob(namespace="lonely", suspend=True,
                                                    validating=True), store)
    assert not lonely.allowed and 'namespace "lonely" has no queue' in lonely.message
    running = _decide("validate", "CREATE", trainjob(labels=QUEUED, suspend=False,
                                                     validating=True), store)
    assert not running.allowed and "has spec.suspend false" in running.message


def test_only_arbiter_or_its_admitted_unit_unsuspends_it() -> None:
    new = copy.deepcopy(ROOT)
    new["spec"]["suspend"] = False
    child = trainers_jobset()  # its unit was made from it
    denial = _decide("validate", "UPDATE", new, _store(child, phase="Enqueued"), old=ROOT)
    assert not denial.allowed and "only kube-arbiter may set spec.suspend to false" in \
        denial.message
    assert _decide("validate", "UPDATE", new, _store(child, phase="Dequeued"), old=ROOT).allowed
    assert _decide("validate", "UPDATE", new, _store(child, phase="Enqueued"), old=ROOT,
                   user={"username": ARBITER_USER}).allowed


# -- its JobSet, Jobs and pods -----------------------------------------------------------
def test_trainers_jobset_passes_as_the_trainjobs_without_a_queue_of_its_own() -> None:
    child = trainers_jobset()
    store = _store()
    assert _decide("mutate", "CREATE", child, store, user=TRAINER).patch == ()
    store.queue_by_namespace.clear()  # its root's queue was checked, not its own
    assert _decide("validate", "CREATE", child, store, user=TRAINER).allowed


def test_its_jobset_is_created_suspended_while_the_trainjob_waits() -> None:
    child = trainers_jobset(suspend=False)
    waiting = _store(phase="Enqueued")
    assert patched(child, _decide("mutate", "CREATE", child, waiting))["spec"]["suspend"] is True
    denial = _decide("validate", "CREATE", child, waiting, user=TRAINER)
    assert not denial.allowed
    assert 'belongs to TrainJob "team-a/tune", which is waiting for queue "team-a"' in \
        denial.message
    # Once its unit is admitted (made again, say, after a deletion: the units
    # last read stand), or the TrainJob runs, Trainer makes it as it is.
    admitted = _store(trainers_jobset(), phase="Dequeued")
    admitted.apply("JobSet", "DELETED", trainers_jobset())
    for store in (admitted, _running_root_store()):
        assert _decide("mutate", "CREATE", child, store).patch == ()
        assert _decide("validate", "CREATE", child, store, user=TRAINER).allowed


def _running_root_store() -> ClusterStore:
    store = _store()
    running = copy.deepcopy(ROOT)
    running["spec"]["suspend"] = False
    cache(store, running)
    return store


def test_the_jobsets_jobs_are_suspended_while_the_trainjob_waits_four_levels_down() -> None:
    child = trainers_jobset()
    store = _store(child, phase="Enqueued")
    obj = owned_by(job("tune-node-0", "team-a", suspend=False, validating=True), child)
    result = patched(obj, _decide("mutate", "CREATE", obj, store, user=JOB_CONTROLLER))
    assert result["spec"]["suspend"] is True
    assert result["metadata"]["labels"] == QUEUED  # the TrainJob's queue
    admitted = _store(child, phase="Dequeued")
    assert not patched(obj, _decide("mutate", "CREATE", obj, admitted,
                                    user=JOB_CONTROLLER))["spec"]["suspend"]


def test_a_jobset_forging_a_reference_to_another_teams_trainjob_passes_nothing() -> None:
    store = _store()
    forged = owned_by(jobset("tune", "team-b", suspend=False, validating=True), ROOT)
    # Not the TrainJob's (another namespace): it is team-b's own work, held.
    result = patched(forged, _decide("mutate", "CREATE", forged, store))
    assert result["metadata"]["labels"] == {QUEUE_LABEL: "team-b"}
    assert result["spec"]["suspend"] is True
    denial = _decide("validate", "CREATE", forged, store)
    assert not denial.allowed and "has spec.suspend false" in denial.message
    # Nor does it lend the TrainJob pod sets, or get any from it.
    cache(store, forged)
    assert store.workloads["TrainJob"]["team-a/tune"].units is None
    lonely = owned_by(jobset("x", "lonely", suspend=True, validating=True), ROOT)
    assert not _decide("validate", "CREATE", lonely, store).allowed


def test_a_kind_switched_off_passes_untouched() -> None:
    store = switch_on(_store(), "jobset")
    obj = trainjob()
    assert workloads.mutate(parse(review("TrainJob", "CREATE", obj)), env_for(store)).patch == ()
