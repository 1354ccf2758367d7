"""Per-namespace limits (issue #25 row 9): a unit naming more resources than
--max-resource-names is denied with the field; a namespace holding
--max-units-per-namespace QueueUnits gets new work denied (the cache's
count, no API call)."""

from __future__ import annotations

from typing import Any

from arbiter.cache.store import ClusterStore
from tests.webhook.admission_samples import (
    ARBITER_USER,
    env_for,
    held,
    job,
    job_pod,
    kubectl_run_pod,
    make_store,
    namespace_obj,
    parse,
    queue_obj,
    review,
    unit_obj,
)
from webhook.endpoints import BY_PATH
from webhook.review import AdmissionEnv, Decision


def _store(units: int = 0) -> ClusterStore:
    return make_store(
        queues=[queue_obj("team-a", namespaces=["team-a"])],
        namespaces=[namespace_obj("team-a")],
        units=[unit_obj(f"r-{i}", "team-a", {"queue": "team-a", "podSets": [
            {"name": "main", "count": 1, "requests": {"cpu": "1"}}]}) for i in range(units)])


def _validate(kind: str, obj: dict[str, Any], store: ClusterStore, *,
              operation: str = "CREATE", user: dict[str, Any] | None = None,
              limit_units: int = 10_000) -> Decision:
    path = {"Pod": "pods", "Job": "jobs", "QueueUnit": "queueunits"}[kind]
    endpoint = BY_PATH[f"/webhook/validate/{path}"]
    env = env_for(store)
    env = AdmissionEnv(store=env.store, own_usernames=env.own_usernames,
                       max_units_per_namespace=limit_units)
    request = review(kind, operation, obj, old=obj if operation == "UPDATE" else None,
                     user=user)
    return endpoint.decide(parse(request), env)


def _names(count: int) -> dict[str, str]:
    return {"cpu": "1", **{f"example.com/r-{i}": "1" for i in range(count - 1)}}


def _pod(count: int) -> dict[str, Any]:
    pod = held(kubectl_run_pod("web", "team-a", validating=True))
    pod["spec"]["containers"][0]["resources"] = {"requests": _names(count)}
    return pod


def _job(count: int) -> dict[str, Any]:
    obj = job("train", "team-a", suspend=True)
    obj["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": _names(count)}
    return obj


def _unit(count: int) -> dict[str, Any]:
    return unit_obj("reserve", "team-a", {"queue": "team-a", "podSets": [
        {"name": "main", "count": 1, "requests": _names(count)}]})


def test_seventeen_resource_names_are_denied_with_the_field() -> None:
    store = _store()
    for kind, build, field in (("Pod", _pod, "spec"), ("Job", _job, "spec.template.spec"),
                               ("QueueUnit", _unit, "spec.podSets[].requests")):
        assert _validate(kind, build(16), store).allowed, kind
        decision = _validate(kind, build(17), store)
        assert not decision.allowed and decision.code == 422, kind
        assert f"{field} names 17 resources" in decision.message
        assert "--max-resource-names" in decision.message and "\n" not in decision.message
    # An update that adds names to a waiting Job's template is held to it too.
    assert not _validate("Job", _job(17), store, operation="UPDATE").allowed
    # arbiter's own writes are not (it copies what the webhook let in).
    assert _validate("QueueUnit", _unit(17), store, user={"username": ARBITER_USER}).allowed


def test_a_namespace_at_its_unit_limit_gets_new_work_denied() -> None:
    store = _store(units=3)
    assert store.units_per_namespace == {"team-a": 3}
    for kind, obj in (("Pod", _pod(1)), ("Job", _job(1)), ("QueueUnit", _unit(1))):
        assert _validate(kind, obj, store, limit_units=4).allowed, kind
        decision = _validate(kind, obj, store, limit_units=3)
        assert not decision.allowed, kind
        assert 'namespace "team-a" holds 3 QueueUnits' in decision.message
        assert "--max-units-per-namespace 3" in decision.message
    # Pods of a Job arbiter admitted are no new unit.
    admitted = job("train", "team-a", labels={"arbiter.dev/queue": "team-a"}, suspend=False)
    admitted["metadata"]["uid"] = "job-uid-1"
    store.apply("Job", "ADDED", admitted)
    pod = job_pod("train", "team-a", queue="team-a", job_uid="job-uid-1")
    assert _validate("Pod", pod, store, limit_units=3).allowed
    # The count follows deletions.
    store.apply("QueueUnit", "DELETED", unit_obj("r-0", "team-a", {}))
    assert store.units_per_namespace == {"team-a": 2}
    assert _validate("Job", _job(1), store, limit_units=3).allowed
