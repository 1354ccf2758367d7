"""Job decisions: suspended on create, queue label on Job and template,
unsuspend and queue moves guarded on update."""

from __future__ import annotations

from arbiter.cache.store import ClusterStore
from tests.webhook.admission_samples import (
    ARBITER_USER,
    QUEUE_LABEL,
    Json,
    env_for,
    job,
    make_store,
    namespace_obj,
    parse,
    patched,
    queue_obj,
    review,
    unit_obj,
)
from webhook import jobs

TRAIN_UID = "7f0c2a4e-train-0000-0000-000000000001"


def _job_unit(name: str, job_name: str, phase: str, uid: str = TRAIN_UID) -> Json:
    """The unit the loop made for Job `job_name` of `uid`."""
    return unit_obj(name, "team-a", {
        "queue": "team-a",
        "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "namespace": "team-a",
                        "name": job_name, "uid": uid},
        "podSets": [{"name": "main", "count": 1, "requests": {"cpu": "1"}}]}, phase=phase)


def _store(unit_phase: str | None = None, unit_uid: str = TRAIN_UID) -> ClusterStore:
    units = []
    if unit_phase is not None:
        units.append(_job_unit("job-train", "train", unit_phase, unit_uid))
    return make_store(
        queues=[queue_obj("team-a", namespaces=["team-a"]), queue_obj("gpu"),
                queue_obj("closed", state="Closed")],
        namespaces=[namespace_obj("team-a"), namespace_obj("lonely")],
        units=units,
    )


def test_mutate_suspends_and_labels_job_and_template() -> None:
    obj = job("train", "team-a")
    decision = jobs.mutate(parse(review("Job", "CREATE", obj)), env_for(_store()))
    result = patched(obj, decision)
    assert result["spec"]["suspend"] is True
    assert result["metadata"]["labels"] == {QUEUE_LABEL: "team-a"}
    assert result["spec"]["template"]["metadata"]["labels"] == {QUEUE_LABEL: "team-a"}


def test_mutate_adds_template_metadata_when_absent_and_suspend_when_unset() -> None:
    obj = job("train", "team-a", suspend=None, labels={"app": "x"},
              template_labels={"app": "x"})
    del obj["spec"]["template"]["metadata"]
    result = patched(obj, jobs.mutate(parse(review("Job", "CREATE", obj)), env_for(_store())))
    assert result["spec"]["template"]["metadata"] == {"labels": {QUEUE_LABEL: "team-a"}}
    assert result["metadata"]["labels"] == {"app": "x", QUEUE_LABEL: "team-a"}
    assert result["spec"]["suspend"] is True


def test_mutate_leaves_unmanaged_jobs_alone_and_holds_unresolvable_ones() -> None:
    decision = jobs.mutate(parse(review("Job", "CREATE", job("x", "kube-system"))),
                           env_for(_store()))
    assert decision.allowed and decision.patch == ()
    # No queue here, but held: the validating call may reach another replica.
    obj = job("x", "lonely")
    result = patched(obj, jobs.mutate(parse(review("Job", "CREATE", obj)), env_for(_store())))
    assert result["spec"]["suspend"] is True and QUEUE_LABEL not in result["metadata"].get(
        "labels", {})


def test_two_replicas_one_still_loading_never_pass_an_unsuspended_job() -> None:
    """Mutated by a replica whose cache has not listed Queues yet (just
    restarted), validated by one that has: the Job was let through
    unsuspended and then denied for good ("spec.suspend false"), 1 in
    10,000 in a chaos run. The loading replica now answers retry."""
    loading, loaded = _store(), _store()
    loading.synced_kinds.discard("Queue")
    obj = job("train", "team-a")
    mutated = jobs.mutate(parse(review("Job", "CREATE", obj)), env_for(loading))
    assert not mutated.allowed and mutated.code == 503
    assert "retry" in mutated.message
    # A Queue the loaded replica knows and the other not yet (its watch lags).
    lagging = make_store(namespaces=[namespace_obj("team-a")])
    obj = job("train", "team-a")
    result = patched(obj, jobs.mutate(parse(review("Job", "CREATE", obj)), env_for(lagging)))
    result["metadata"].setdefault("uid", TRAIN_UID)
    decision = jobs.validate(parse(review("Job", "CREATE", result)), env_for(loaded))
    assert decision.allowed, decision.message
    # The excluded namespaces are answered while loading.
    system = jobs.mutate(parse(review("Job", "CREATE", job("x", "kube-system"))),
                         env_for(loading))
    assert system.allowed


def test_validate_create_denials() -> None:
    env = env_for(_store())
    lonely = jobs.validate(parse(review("Job", "CREATE", job("x", "lonely", validating=True))),
                           env)
    assert not lonely.allowed and lonely.message.startswith(
        'namespace "lonely" has no queue: label the Job or namespace')
    closed = job("x", "team-a", labels={QUEUE_LABEL: "closed"}, validating=True)
    decision = jobs.validate(parse(review("Job", "CREATE", closed)), env)
    assert not decision.allowed and 'queue "closed"' in decision.message
    fine = job("x", "team-a", labels={QUEUE_LABEL: "team-a"}, suspend=True, validating=True)
    assert jobs.validate(parse(review("Job", "CREATE", fine)), env).allowed


def _held(suspend: bool = True, queue: str = "team-a", parallelism: int = 1) -> Json:
    obj = job("train", "team-a", labels={QUEUE_LABEL: queue}, suspend=suspend,
              template_labels={QUEUE_LABEL: "team-a"}, validating=True)
    obj["metadata"]["uid"] = TRAIN_UID
    obj["spec"]["parallelism"] = parallelism
    return obj


def test_user_may_not_unsuspend_waiting_job() -> None:
    request = parse(review("Job", "UPDATE", _held(suspend=False), old=_held()))
    decision = jobs.validate(request, env_for(_store("Enqueued")))
    assert not decision.allowed
    assert decision.message == ('Job "team-a/train" is waiting for queue "team-a" to admit it: '
                                "only kube-arbiter may set spec.suspend to false")
    # No unit yet at all: still waiting.
    assert not jobs.validate(request, env_for(_store())).allowed


def test_arbiter_may_unsuspend_and_admitted_unit_allows_it() -> None:
    arbiter = parse(review("Job", "UPDATE", _held(suspend=False), old=_held(),
                           user={"username": ARBITER_USER}))
    assert jobs.validate(arbiter, env_for(_store())).allowed
    user = parse(review("Job", "UPDATE", _held(suspend=False), old=_held()))
    assert jobs.validate(user, env_for(_store("Dequeued"))).allowed
    assert jobs.validate(user, env_for(_store("Running"))).allowed


def test_admitted_job_may_not_change_queue() -> None:
    request = parse(review("Job", "UPDATE", _held(suspend=False, queue="gpu"),
                           old=_held(suspend=False)))
    decision = jobs.validate(request, env_for(_store("Running")))
    assert not decision.allowed
    assert 'admitted by queue "team-a" and cannot move to queue "gpu"' in decision.message


def test_waiting_job_may_move_to_open_queue_only() -> None:
    env = env_for(_store("Enqueued"))
    moved = parse(review("Job", "UPDATE", _held(queue="gpu"), old=_held()))
    assert jobs.validate(moved, env).allowed
    closed = parse(review("Job", "UPDATE", _held(queue="closed"), old=_held()))
    assert not jobs.validate(closed, env).allowed
    missing = parse(review("Job", "UPDATE", _held(queue="nope"), old=_held()))
    assert "does not exist" in jobs.validate(missing, env).message


def test_queue_label_may_not_be_removed() -> None:
    new = _held()
    del new["metadata"]["labels"]
    decision = jobs.validate(parse(review("Job", "UPDATE", new, old=_held())),
                             env_for(_store()))
    assert not decision.allowed and "cannot be removed" in decision.message


def test_jobs_arbiter_does_not_manage_are_not_guarded() -> None:
    old = job("legacy", "team-a", suspend=True, validating=True)
    new = job("legacy", "team-a", suspend=False, validating=True)
    assert jobs.validate(parse(review("Job", "UPDATE", new, old=old)), env_for(_store())).allowed


def test_unsuspend_finds_the_unit_under_the_loops_name_for_a_long_job_name() -> None:
    from arbiter.core.api import job_unit_name

    long_name = "t" * 250  # job-<name> exceeds 253: the loop hashes the unit's name
    unit = job_unit_name(long_name)
    assert unit != f"job-{long_name}"
    store = make_store(queues=[queue_obj("team-a", namespaces=["team-a"])],
                       namespaces=[namespace_obj("team-a")],
                       units=[_job_unit(unit, long_name, "Dequeued")])

    def held(suspend: bool) -> Json:
        obj = job(long_name, "team-a", labels={QUEUE_LABEL: "team-a"}, suspend=suspend,
                  template_labels={QUEUE_LABEL: "team-a"}, validating=True)
        obj["metadata"]["uid"] = TRAIN_UID
        return obj

    request = parse(review("Job", "UPDATE", held(False), old=held(True)))
    assert jobs.validate(request, env_for(store)).allowed


def test_min_parallelism_must_be_a_whole_number_up_to_parallelism() -> None:
    env = env_for(_store())

    def create(value: str, parallelism: int | None = 8) -> tuple[bool, str]:
        obj = job("x", "team-a", labels={QUEUE_LABEL: "team-a"}, suspend=True,
                  validating=True)
        obj["metadata"]["annotations"] = {"arbiter.dev/min-parallelism": value}
        if parallelism is not None:
            obj["spec"]["parallelism"] = parallelism
        decision = jobs.validate(parse(review("Job", "CREATE", obj)), env)
        return decision.allowed, decision.message

    assert create("3") == (True, "")
    assert create("8")[0] and create("1", None)[0]
    for bad in ("0", "9", "-1", "three", "2.5", "", "３"):
        allowed, message = create(bad)
        assert not allowed and message.startswith("annotation arbiter.dev/min-parallelism:")
        assert "from 1 to the Job's parallelism (8)" in message
    assert not create("2", None)[0]  # parallelism defaults to 1
