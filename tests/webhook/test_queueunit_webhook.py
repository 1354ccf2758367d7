"""QueueUnit decisions: shorthand conversion and pod set validation."""

from __future__ import annotations

from typing import Any

from arbiter.cache import convert
from arbiter.cache.store import ClusterStore
from tests.webhook.admission_samples import (
    ARBITER_USER,
    QUEUE_LABEL,
    env_for,
    make_store,
    namespace_obj,
    parse,
    patched,
    queue_obj,
    review,
    unit_obj,
)
from webhook import queueunits
from webhook.review import Decision


def _store() -> ClusterStore:
    return make_store(queues=[queue_obj("team-a", namespaces=["team-a"]),
                              queue_obj("closed", state="Closed")],
                      namespaces=[namespace_obj("team-a")])


def _validate(spec: dict[str, Any], *, user: str | None = None) -> Decision:
    obj = unit_obj("reserve", "team-a", spec)
    request = review("QueueUnit", "CREATE", obj,
                     user={"username": user} if user is not None else None)
    return queueunits.validate(parse(request), env_for(_store()))


def test_shorthand_becomes_one_pod_set_and_queue_is_resolved() -> None:
    obj = unit_obj("reserve", "team-a", {"resourceUnit": {"cpu": "2", "memory": "1Gi"},
                                         "resourceNo": 3})
    decision = queueunits.mutate(parse(review("QueueUnit", "CREATE", obj)), env_for(_store()))
    result = patched(obj, decision)
    assert result["spec"] == {"queue": "team-a", "podSets": [
        {"name": "main", "count": 3, "requests": {"cpu": "2", "memory": "1Gi"}}]}
    assert result["metadata"]["labels"] == {QUEUE_LABEL: "team-a"}
    # The converted unit validates and demands 6 CPU, 3 GiB.
    assert queueunits.validate(parse(review("QueueUnit", "CREATE", result)),
                               env_for(_store())).allowed
    record = convert.unit_from_api(result)
    assert record.demand == {"cpu": 6000, "memory": 3 * 2**30}


def test_pod_sets_are_left_alone() -> None:
    spec = {"queue": "team-a", "podSets": [{"name": "main", "count": 1}]}
    obj = unit_obj("u", "team-a", spec, labels={QUEUE_LABEL: "team-a"})
    decision = queueunits.mutate(parse(review("QueueUnit", "CREATE", obj)), env_for(_store()))
    assert decision.patch == ()


def test_pod_set_rules() -> None:
    ok = {"queue": "team-a", "podSets": [
        {"name": "driver", "count": 1, "requests": {"cpu": "1"}},
        {"name": "workers", "count": 4, "minCount": 2, "requests": {"cpu": "500m"}}]}
    assert _validate(ok).allowed
    cases: list[tuple[dict[str, Any], str]] = [
        ({"queue": "team-a", "podSets": []}, "spec.podSets: at least one pod set"),
        ({"queue": "team-a", "podSets": [{"name": f"s{i}", "count": 1} for i in range(9)]},
         "9 pod sets, at most 8"),
        ({"queue": "team-a", "podSets": [{"name": "a", "count": 0}]},
         "spec.podSets[0].count: 0 must be an integer ≥ 1"),
        ({"queue": "team-a", "podSets": [{"name": "a", "count": 2, "minCount": 3}]},
         "spec.podSets[0].minCount: 3 exceeds count 2"),
        ({"queue": "team-a", "podSets": [{"name": "a", "count": 1,
                                          "requests": {"memory": "1Gb"}}]},
         "spec.podSets[0].requests.memory: '1Gb' is not a valid quantity"),
        ({"queue": "team-a", "podSets": [{"name": "a", "count": 1}, {"name": "a", "count": 1}]},
         'spec.podSets[1].name: "a" is used by another pod set'),
        ({"queue": "team-a", "podSets": [{"name": "a", "count": 1}],
          "resourceUnit": {"cpu": "1"}}, "not both"),
        ({"podSets": [{"name": "a", "count": 1}]}, "spec.queue"),
    ]
    for spec, expected in cases:
        decision = _validate(spec)
        assert not decision.allowed, spec
        assert expected in decision.message, (expected, decision.message)


def test_user_reservation_needs_open_queue_but_arbiter_units_do_not() -> None:
    spec = {"queue": "closed", "podSets": [{"name": "main", "count": 1}]}
    assert "is Closed" in _validate(spec).message
    assert _validate(spec, user=ARBITER_USER).allowed


def test_admitted_unit_spec_is_frozen() -> None:
    spec = {"queue": "team-a", "podSets": [{"name": "main", "count": 1}]}
    old = unit_obj("u", "team-a", spec, phase="Dequeued")
    new = unit_obj("u", "team-a", {**spec, "podSets": [{"name": "main", "count": 2}]},
                   phase="Dequeued")
    decision = queueunits.validate(parse(review("QueueUnit", "UPDATE", new, old=old)),
                                   env_for(_store()))
    assert not decision.allowed and "spec.podSets cannot change" in decision.message
    old["status"]["phase"] = "Enqueued"
    assert queueunits.validate(parse(review("QueueUnit", "UPDATE", new, old=old)),
                               env_for(_store())).allowed


def test_pod_set_check_stops_at_the_limit() -> None:
    """100,000 pod sets: one error, no per-set work past the limit of 8."""
    bad_sets = [{"name": "same", "count": "x", "requests": {"cpu": "bad"}}
                for _ in range(100_000)]
    spec = {"queue": "team-a", "podSets": bad_sets}
    decision = _validate(spec)
    assert not decision.allowed
    assert "100000 pod sets, at most 8 allowed" in decision.message
    errors = queueunits.check_pod_sets(spec)
    assert errors == ["spec.podSets: 100000 pod sets, at most 8 allowed"]


def test_only_arbiter_may_set_the_consumer_ref() -> None:
    """A tenant's unit naming someone's Job as its consumer could be admitted
    in the Job's stead (with any demand): only arbiter's identity sets
    `spec.consumerRef`, on CREATE and on UPDATE alike."""
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "victim", "uid": "u-1"}
    spec = {"queue": "team-a", "podSets": [{"name": "main", "count": 1}], "consumerRef": ref}
    denied = _validate(spec)
    assert not denied.allowed
    assert "spec.consumerRef" in denied.message and "\n" not in denied.message
    assert _validate(spec, user=ARBITER_USER).allowed
    # A user may edit arbiter's unit (labels, say) as long as the reference stays.
    old = unit_obj("job-victim", "team-a", spec)
    same = unit_obj("job-victim", "team-a", spec, labels={"team": "a"})
    assert queueunits.validate(parse(review("QueueUnit", "UPDATE", same, old=old)),
                               env_for(_store())).allowed
    other = unit_obj("job-victim", "team-a", {**spec, "consumerRef": {**ref, "uid": "u-2"}})
    changed = queueunits.validate(parse(review("QueueUnit", "UPDATE", other, old=old)),
                                  env_for(_store()))
    assert not changed.allowed and "spec.consumerRef" in changed.message
    plain = {"queue": "team-a", "podSets": [{"name": "main", "count": 1}]}
    added = queueunits.validate(
        parse(review("QueueUnit", "UPDATE", unit_obj("r", "team-a", spec),
                     old=unit_obj("r", "team-a", plain))), env_for(_store()))
    assert not added.allowed and "spec.consumerRef" in added.message


def _status_update(old_status: dict[str, Any], new_status: dict[str, Any], *,
                   user: str = "approver") -> Decision:
    spec = {"queue": "team-a", "podSets": [{"name": "main", "count": 1}]}
    old = {**unit_obj("u", "team-a", spec), "status": old_status}
    new = {**unit_obj("u", "team-a", spec), "status": new_status}
    request = review("QueueUnit", "UPDATE", new, old=old, user={"username": user})
    request["request"]["subResource"] = "status"
    return queueunits.validate(parse(request), env_for(_store()))


RESERVED: dict[str, Any] = {"phase": "Reserved", "admissions": [{"queue": "team-a"}],
            "admissionChecks": [{"name": "approval", "state": "Pending"},
                                {"name": "budget", "state": "Pending"}]}


def test_others_may_set_only_the_state_and_message_of_admission_checks() -> None:
    approved = {**RESERVED, "admissionChecks": [
        {"name": "approval", "state": "Ready", "message": "ok",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"name": "budget", "state": "Pending"}]}
    assert _status_update(RESERVED, approved).allowed
    # The status is arbiter's record of admission: a forged phase, admission
    # entry, renamed or added check, or a change after Reserved is refused.
    forged = [
        {**approved, "phase": "Dequeued"},
        {**RESERVED, "admissions": [{"queue": "team-a"}, {"queue": "team-a"}]},
        {**RESERVED, "admission": {"pool": "gpu"}},
        {**RESERVED, "admissionChecks": [{"name": "other", "state": "Ready"},
                                         {"name": "budget", "state": "Pending"}]},
        {**RESERVED, "admissionChecks": [{"name": "approval", "state": "Ready"}]},
    ]
    for status in forged:
        decision = _status_update(RESERVED, status)
        assert not decision.allowed and decision.code == 403, status
        assert "kube-arbiter" in decision.message and "\n" not in decision.message
    dequeued = {**RESERVED, "phase": "Dequeued"}
    late = {**dequeued, "admissionChecks": [{"name": "approval", "state": "Rejected"},
                                            {"name": "budget", "state": "Pending"}]}
    assert "only while the unit is Reserved" in _status_update(dequeued, late).message
    # arbiter writes its own status freely; a status left as it was is fine.
    assert _status_update(RESERVED, {**RESERVED, "phase": "Dequeued"}, user=ARBITER_USER).allowed
    assert _status_update(RESERVED, dict(RESERVED)).allowed


def test_hostile_status_bodies_are_refused_not_crashed() -> None:
    deep: Any = {"x": 1}
    for _ in range(200):  # deeper bodies never parse (orjson's limit: HTTP 400)
        deep = {"x": deep}
    for status in ({**RESERVED, "admissionChecks": "no"},
                   {**RESERVED, "admissionChecks": [1, 2]},
                   {**RESERVED, "extra": deep}):
        decision = _status_update(RESERVED, status)
        assert not decision.allowed and len(decision.message) < 400
