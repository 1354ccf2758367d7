"""The Job webhook's side of admission at creation (DESIGN §16): the
leader's answer patched in, the held path otherwise, and a token checked
by the validating webhook: a tenant's own never lets a Job in unsuspended."""

from __future__ import annotations

import dataclasses
from typing import Any

from arbiter.cache import convert
from arbiter.cache.convert import job_from_api
from arbiter.cache.fastpath import job_demand
from arbiter.core.api import ADMITTED_STATUS_ANNOTATION, parse_time
from arbiter.core.fastpath import FAST_PATH_ANNOTATION, FastPathToken, derive_key, sign
from tests.webhook.admission_samples import (
    ARBITER_USER,
    QUEUE_LABEL,
    TENANT,
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
from webhook import jobs, queueunits
from webhook.review import AdmissionEnv

KEY = derive_key(b"the CA key")


def _env(answer: list[dict[str, Any]] | None = None, calls: list[str] | None = None,
         key: bytes | None = KEY) -> AdmissionEnv:
    store = make_store(queues=[queue_obj("team-a", namespaces=["team-a"])],
                       namespaces=[namespace_obj("team-a")])

    def admit(namespace: str, name: str, queue: str, obj: Json) -> list[dict[str, Any]] | None:
        if calls is not None:
            calls.append(f"{namespace}/{name}:{queue}")
        return answer

    return dataclasses.replace(env_for(store), admit_on_create=admit, fast_path_key=key)


def _signed(obj: Json, *, name: str | None = None, queue: str = "team-a",
            issued: float | None = None) -> str:
    """A token as the leader writes it for `obj` (as stored: created at its timestamp)."""
    record = job_from_api(obj)
    created = parse_time(obj["metadata"]["creationTimestamp"])
    token = FastPathToken(f"job-{name or record.name}", queue, "",
                          int((issued if issued is not None else created) * 1000))
    return sign(KEY, record.namespace, name or record.name, token, job_demand(record))


def test_the_leaders_answer_lets_the_job_through_unsuspended() -> None:
    calls: list[str] = []
    answer = [{"op": "add", "path": "/metadata/annotations", "value": {FAST_PATH_ANNOTATION: "t"}}]
    obj = job("train", "team-a")
    result = patched(obj, jobs.mutate(parse(review("Job", "CREATE", obj, user=TENANT)),
                                      _env(answer, calls)))
    assert calls == ["team-a/train:team-a"]
    assert result["spec"]["suspend"] is False
    assert result["metadata"]["annotations"] == {FAST_PATH_ANNOTATION: "t"}
    assert result["metadata"]["labels"] == {QUEUE_LABEL: "team-a"}


def test_without_the_leaders_answer_the_job_is_held_and_a_tenants_token_removed() -> None:
    obj = job("train", "team-a")
    obj["metadata"]["annotations"] = {FAST_PATH_ANNOTATION: "v1;job-train;team-a;;1;" + "0" * 32}
    result = patched(obj, jobs.mutate(parse(review("Job", "CREATE", obj, user=TENANT)), _env()))
    assert result["spec"]["suspend"] is True
    assert FAST_PATH_ANNOTATION not in result["metadata"].get("annotations", {})


def test_dry_runs_and_jobs_the_validation_denies_are_never_asked() -> None:
    calls: list[str] = []
    obj = job("train", "team-a")
    body = review("Job", "CREATE", obj, user=TENANT)
    body["request"]["dryRun"] = True
    assert patched(obj, jobs.mutate(parse(body), _env([], calls)))["spec"]["suspend"] is True
    other = job("train", "team-a", labels={QUEUE_LABEL: "missing"})
    jobs.mutate(parse(review("Job", "CREATE", other, user=TENANT)), _env([], calls))
    assert calls == []


def _create(obj: Json, key: bytes | None = KEY) -> Any:
    return jobs.validate(parse(review("Job", "CREATE", obj, user=TENANT)), _env(key=key))


def _unsuspended(name: str = "train", parallelism: int = 1) -> Json:
    obj = job(name, "team-a", labels={QUEUE_LABEL: "team-a"},
              template_labels={QUEUE_LABEL: "team-a"}, validating=True)
    obj["spec"]["parallelism"] = obj["spec"]["completions"] = parallelism
    return obj


def test_an_unsuspended_job_with_arbiters_token_is_let_in() -> None:
    obj = _unsuspended()
    obj["metadata"]["annotations"] = {FAST_PATH_ANNOTATION: _signed(obj)}
    assert _create(obj).allowed


def test_a_tenants_own_token_never_lets_a_job_in_unsuspended() -> None:
    forged = _unsuspended()
    forged["metadata"]["annotations"] = {
        FAST_PATH_ANNOTATION: _signed(forged)[:-4] + "beef"}
    assert not _create(forged).allowed
    # A genuine token of another Job, of a smaller demand, of a creation
    # long before, or with no key configured: none counts.
    other = _unsuspended()
    other["metadata"]["annotations"] = {FAST_PATH_ANNOTATION: _signed(other, name="small")}
    assert not _create(other).allowed
    bigger = _unsuspended(parallelism=4)
    bigger["metadata"]["annotations"] = {FAST_PATH_ANNOTATION: _signed(_unsuspended())}
    assert not _create(bigger).allowed
    replayed = _unsuspended()
    created = parse_time(replayed["metadata"]["creationTimestamp"])
    replayed["metadata"]["annotations"] = {
        FAST_PATH_ANNOTATION: _signed(replayed, issued=created - 120)}
    assert not _create(replayed).allowed
    genuine = _unsuspended()
    genuine["metadata"]["annotations"] = {FAST_PATH_ANNOTATION: _signed(genuine)}
    assert not _create(genuine, key=None).allowed
    assert "spec.suspend false" in _create(forged).message


def test_the_token_cannot_be_added_or_changed_by_an_update() -> None:
    old = _unsuspended()
    new = _unsuspended()
    new["metadata"]["uid"] = old["metadata"]["uid"]
    new["metadata"]["annotations"] = {FAST_PATH_ANNOTATION: _signed(new)}
    decision = jobs.validate(parse(review("Job", "UPDATE", new, old=old, user=TENANT)), _env())
    assert not decision.allowed and FAST_PATH_ANNOTATION in decision.message


def test_only_arbiter_records_an_admission_on_a_unit() -> None:
    """A reservation carrying the annotation the cache reads as an
    admission at creation would be admitted without a queue."""
    store = make_store(queues=[queue_obj("team-a", namespaces=["team-a"])],
                       namespaces=[namespace_obj("team-a")])
    obj = unit_obj("mine", "team-a", {"queue": "team-a", "podSets": [
        {"name": "main", "count": 1, "requests": {"cpu": "1"}}]},
        labels={QUEUE_LABEL: "team-a"})
    obj["metadata"]["annotations"] = {
        ADMITTED_STATUS_ANNOTATION: '{"phase": "Dequeued", "admissions": [{"attempt": 1}]}'}
    decision = queueunits.validate(parse(review("QueueUnit", "CREATE", obj, user=TENANT)),
                                   env_for(store))
    assert not decision.allowed and ADMITTED_STATUS_ANNOTATION in decision.message
    assert queueunits.validate(parse(review("QueueUnit", "CREATE", obj,
                                            user={"username": ARBITER_USER})),
                               env_for(store)).allowed
    assert convert.unit_from_api(obj).phase == "Dequeued"
