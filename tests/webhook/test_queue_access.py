"""DESIGN §13: work may name only a queue that admits its namespace.

Queues here: team-a lists team-a, team-b lists team-b, gpu selects the
namespaces labelled tier=gold, shared names no namespace (open to every
managed namespace). Each kind naming another team's queue is denied with a
message naming the queues the namespace may use.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest

from arbiter.cache.access import names_namespace
from arbiter.cache.store import ClusterStore
from arbiter.core.api import MANAGED_LABEL, POD_GROUP_LABEL, POD_GROUP_SIZE_ANNOTATION, QUEUE_LABEL
from arbiter.core.selectors import LabelSelector, SelectorError, parse_selector
from tests.webhook.admission_samples import (
    env_for,
    held,
    job,
    kubectl_run_pod,
    make_store,
    namespace_obj,
    parse,
    patched,
    queue_obj,
    review,
    unit_obj,
)
from webhook import jobflows, jobs, pods, queues, queueunits
from webhook.configuration import desired_configurations
from webhook.review import AdmissionEnv, Decision, parse_review

FOREIGN = ('queue "team-b" (from the {what}\'s arbiter.dev/queue label) does not admit '
           'namespace "team-a" (neither its spec.namespaces nor its spec.namespaceSelector): '
           'namespace "team-a" may use "shared", "team-a"')


def _store(*extra_queues: dict[str, Any]) -> ClusterStore:
    return make_store(
        queues=[queue_obj("team-a", namespaces=["team-a"]),
                queue_obj("team-b", namespaces=["team-b"]),
                queue_obj("gpu", namespaceSelector={"matchLabels": {"tier": "gold"}}),
                queue_obj("shared"), *extra_queues],
        namespaces=[namespace_obj("team-a"), namespace_obj("team-b"),
                    namespace_obj("gold", {"tier": "gold"}),
                    namespace_obj("labelled", {QUEUE_LABEL: "team-b"})])


def _pod(namespace: str, queue: str, **labels: str) -> dict[str, Any]:
    # As the validating webhook sees it: held by the mutating one.
    return held(kubectl_run_pod("web", namespace, labels={QUEUE_LABEL: queue, **labels},
                                validating=True))


def _validate_pod(pod: dict[str, Any], store: ClusterStore) -> Decision:
    return pods.validate(parse(review("Pod", "CREATE", pod)), env_for(store))


def _validate_job(obj: dict[str, Any], store: ClusterStore) -> Decision:
    return jobs.validate(parse(review("Job", "CREATE", obj)), env_for(store))


def _reservation(namespace: str, queue: str) -> dict[str, Any]:
    return unit_obj("r", namespace, {"queue": queue, "podSets": [
        {"name": "main", "count": 1, "requests": {"cpu": "1"}}]})


def _validate_unit(unit: dict[str, Any], store: ClusterStore, operation: str = "CREATE",
                   old: dict[str, Any] | None = None) -> Decision:
    return queueunits.validate(parse(review("QueueUnit", operation, unit, old=old)),
                               env_for(store))


def _flow_check(flow: dict[str, Any], store: ClusterStore) -> Decision:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "arbiter.dev", "version": "v1alpha1", "kind": "JobFlow"},
        "resource": {"group": "arbiter.dev", "version": "v1alpha1", "resource": "jobflows"},
        "operation": "CREATE", "namespace": "team-a", "name": flow["metadata"]["name"],
        "userInfo": {"username": "tenant"}, "object": flow, "oldObject": None}}
    request = parse_review(orjson.dumps(body), jobflows.GROUP, jobflows.KIND)
    return jobflows.validate(request, AdmissionEnv(store=store))


def _flow(**meta_and_spec: Any) -> dict[str, Any]:
    labels = meta_and_spec.pop("labels", None)
    meta: dict[str, Any] = {"name": "flow", "namespace": "team-a", "uid": str(uuid.uuid4())}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "JobFlow", "metadata": meta,
            "spec": {"flows": [{"name": "a"}], **meta_and_spec}}


# -- each kind naming a foreign queue -------------------------------------------

def test_pod_naming_another_teams_queue_is_denied_with_the_choices() -> None:
    decision = _validate_pod(_pod("team-a", "team-b"), _store())
    assert not decision.allowed and decision.code == 403
    assert decision.message == FOREIGN.format(what="pod")


def test_pod_group_member_naming_another_teams_queue_is_denied() -> None:
    pod = _pod("team-a", "team-b", **{POD_GROUP_LABEL: "g"})
    pod["metadata"]["annotations"] = {POD_GROUP_SIZE_ANNOTATION: "2"}
    decision = _validate_pod(pod, _store())
    assert not decision.allowed and decision.message == FOREIGN.format(what="pod")


def test_job_naming_another_teams_queue_is_denied() -> None:
    decision = _validate_job(job("train", "team-a", labels={QUEUE_LABEL: "team-b"},
                                 validating=True), _store())
    assert not decision.allowed and decision.message == FOREIGN.format(what="Job")


def test_reservation_naming_another_teams_queue_is_denied() -> None:
    decision = _validate_unit(_reservation("team-a", "team-b"), _store())
    assert not decision.allowed
    assert decision.message.startswith('queue "team-b" (from ')
    assert decision.message.endswith(
        'does not admit namespace "team-a" (neither its spec.namespaces nor its '
        'spec.namespaceSelector): namespace "team-a" may use "shared", "team-a"')


def test_waiting_reservation_may_not_move_to_a_foreign_queue() -> None:
    old = _reservation("team-a", "team-a")
    new = _reservation("team-a", "team-b")
    decision = _validate_unit(new, _store(), "UPDATE", old)
    assert not decision.allowed and 'does not admit namespace "team-a"' in decision.message


def test_waiting_job_may_not_move_to_a_foreign_queue() -> None:
    old = job("train", "team-a", labels={QUEUE_LABEL: "team-a"}, suspend=True)
    new = job("train", "team-a", labels={QUEUE_LABEL: "team-b"}, suspend=True)
    decision = jobs.validate(parse(review("Job", "UPDATE", new, old=old)), env_for(_store()))
    assert not decision.allowed and decision.message == FOREIGN.format(what="Job")


def test_jobflow_naming_a_foreign_queue_is_denied_by_spec_or_label() -> None:
    store = _store()
    store.replace_all("JobTemplate", [{"metadata": {"name": "a", "namespace": "team-a"},
                                       "spec": {"template": {}}}])
    store.synced_kinds.add("JobTemplate")
    by_spec = _flow_check(_flow(queue="team-b"), store)
    assert not by_spec.allowed
    assert by_spec.message.startswith(
        'JobFlow "team-a/flow": spec.queue: queue "team-b" does not admit namespace "team-a"')
    by_label = _flow_check(_flow(labels={QUEUE_LABEL: "team-b"}), store)
    assert not by_label.allowed
    assert by_label.message == FOREIGN.format(what="JobFlow")
    assert _flow_check(_flow(queue="shared"), store).allowed


# -- what is admitted ------------------------------------------------------------

def test_namespace_selector_match_is_allowed_and_a_mismatch_denied() -> None:
    store = _store()
    assert _validate_pod(_pod("gold", "gpu"), store).allowed
    assert _validate_job(job("train", "gold", labels={QUEUE_LABEL: "gpu"}, suspend=True,
                             validating=True), store).allowed
    assert _validate_unit(_reservation("gold", "gpu"), store).allowed
    denied = _validate_pod(_pod("team-a", "gpu"), store)
    assert not denied.allowed and 'queue "gpu"' in denied.message
    # Relabelling the namespace (an admin's act) moves it in and out.
    store.apply("Namespace", "MODIFIED", namespace_obj("team-a", {"tier": "gold"}))
    assert _validate_pod(_pod("team-a", "gpu"), store).allowed
    store.apply("Namespace", "MODIFIED", namespace_obj("team-a"))
    assert not _validate_pod(_pod("team-a", "gpu"), store).allowed


def test_a_queue_change_takes_effect_at_once() -> None:
    store = _store()
    assert not _validate_pod(_pod("team-a", "team-b"), store).allowed
    store.apply("Queue", "MODIFIED", queue_obj("team-b", namespaces=["team-b", "team-a"]))
    assert _validate_pod(_pod("team-a", "team-b"), store).allowed


def test_open_queue_and_namespace_label_admit() -> None:
    store = _store()
    assert _validate_pod(_pod("team-b", "shared"), store).allowed
    # An admin's arbiter.dev/queue label on the namespace admits it there.
    assert _validate_pod(_pod("labelled", "team-b"), store).allowed
    unlabelled = held(kubectl_run_pod("web", "labelled", validating=True))
    assert _validate_pod(unlabelled, store).allowed


def test_denial_lists_at_most_five_queues() -> None:
    store = _store(*(queue_obj(f"open-{i:02d}") for i in range(40)))
    message = _validate_pod(_pod("team-a", "team-b"), store).message
    assert message.endswith('may use "open-00", "open-01", "open-02", "open-03", '
                            '"open-04" and 37 more')
    assert len(message) < 400


def test_namespace_with_no_queue_at_all_is_told_to_ask_an_admin() -> None:
    store = make_store(queues=[queue_obj("team-b", namespaces=["team-b"])],
                       namespaces=[namespace_obj("team-a")])
    message = _validate_pod(_pod("team-a", "team-b"), store).message
    assert message.endswith(
        'namespace "team-a" may use no queue: ask an admin to list it in a Queue\'s '
        "spec.namespaces or select it with spec.namespaceSelector")


# -- Queue validation ----------------------------------------------------------------

def _queue_check(obj: dict[str, Any]) -> Decision:
    return queues.validate(parse(review("Queue", "CREATE", obj)), env_for(_store()))


@pytest.mark.parametrize(("selector", "problem"), [
    ("gold", "spec.namespaceSelector: must be an object"),
    ({"matchLabels": {"tier": 1}}, "spec.namespaceSelector.matchLabels: must map"),
    ({"matchExpressions": [{"key": "tier", "operator": "Near", "values": ["x"]}]},
     'spec.namespaceSelector.matchExpressions[0].operator: "Near" must be one of'),
    ({"matchExpressions": [{"key": "tier", "operator": "In"}]},
     "spec.namespaceSelector.matchExpressions[0].values: must not be empty for operator In"),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["x"]}]},
     "matchExpressions[0].values: must be empty for operator Exists"),
    ({"matchLabel": {"tier": "gold"}}, "spec.namespaceSelector: unknown field matchLabel"),
])
def test_bad_namespace_selector_is_denied_naming_the_field(selector: Any, problem: str) -> None:
    decision = _queue_check(queue_obj("q", namespaceSelector=selector))
    assert not decision.allowed and decision.code == 422
    assert problem in decision.message, decision.message


def test_an_open_queue_is_allowed_with_a_warning() -> None:
    decision = _queue_check(queue_obj("q"))
    assert decision.allowed
    assert decision.warnings == ("spec.namespaces and spec.namespaceSelector are both empty: "
                                 "every managed namespace may use this queue (list or select "
                                 "namespaces to keep it to a team)",)
    assert _queue_check(queue_obj("q", namespaces=["team-q"])).warnings == ()


def test_valid_namespace_selector_is_allowed() -> None:
    selector = {"matchLabels": {"tier": "gold"},
                "matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["x"]},
                                     {"key": "env", "operator": "Exists"}]}
    assert _queue_check(queue_obj("q", namespaceSelector=selector)).allowed


def test_the_index_agrees_with_the_rule_namespace_by_namespace() -> None:
    store = _store(queue_obj("both", namespaces=["team-a"],
                             namespaceSelector={"matchExpressions": [
                                 {"key": "tier", "operator": "Exists"}]}))
    for name in ("team-a", "team-b", "gold", "labelled", "unknown"):
        record = store.namespaces.get(name)
        expected = tuple(sorted(q.name for q in store.queues.values()
                                if names_namespace(q, name, record)))
        assert store.admitting_queues(name) == expected, name
    assert store.admitting_queues("gold") == ("both", "gpu")
    assert store.admitting_queues("team-a") == ("both", "team-a")


def test_selector_semantics_are_the_apiservers() -> None:
    selector = parse_selector({"matchLabels": {"a": "1"}, "matchExpressions": [
        {"key": "b", "operator": "NotIn", "values": ["x"]},
        {"key": "c", "operator": "DoesNotExist"}]}, "s")
    assert selector is not None
    assert selector.matches({"a": "1"}) and selector.matches({"a": "1", "b": "y"})
    assert not selector.matches({"a": "1", "b": "x"})
    assert not selector.matches({"a": "1", "c": ""})
    assert not selector.matches({"a": "2"})
    assert parse_selector({}, "s") == LabelSelector()  # matches everything
    assert LabelSelector().matches({})
    assert parse_selector(None, "s") is None
    with pytest.raises(SelectorError):
        parse_selector({"matchExpressions": [{}] * 40}, "s")


# -- managed namespaces: listed ---------------------------------------------------

def test_listed_mode_manages_only_admitted_or_labelled_namespaces() -> None:
    store = _store()
    store.apply("Namespace", "ADDED", namespace_obj("ingress"))
    store.apply("Namespace", "ADDED", namespace_obj("opted", {MANAGED_LABEL: "true"}))
    store.apply("Namespace", "ADDED", namespace_obj("out", {MANAGED_LABEL: "false",
                                                            "tier": "gold"}))
    assert all(store.is_managed_namespace(ns) for ns in ("ingress", "team-a", "opted"))
    store.managed_mode = "listed"
    assert not store.is_managed_namespace("ingress")  # only the open queue would take it
    assert store.is_managed_namespace("team-a") and store.is_managed_namespace("gold")
    assert store.is_managed_namespace("labelled")  # its queue label names team-b
    assert store.is_managed_namespace("opted")
    assert not store.is_managed_namespace("out")  # an admin's "false" wins
    assert not store.is_managed_namespace("kube-system")
    # Not managed: a pod is left alone (no label, no gate, no denial).
    pod = kubectl_run_pod("web", "ingress")
    decision = pods.mutate(parse(review("Pod", "CREATE", pod)), env_for(store))
    assert decision.allowed and patched(pod, decision) == pod
    assert _validate_pod(kubectl_run_pod("web", "ingress", validating=True), store).allowed
    # A Queue selecting it brings it in.
    store.apply("Queue", "MODIFIED", queue_obj("shared", namespaceSelector={
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                              "values": ["ingress"]}]}))
    assert store.is_managed_namespace("ingress")


def test_webhook_configurations_select_the_managed_label_in_listed_mode() -> None:
    for mode, operator, values in (("all", "NotIn", ["false"]), ("listed", "In", ["true"])):
        mutating, validating = desired_configurations(
            service=("arbiter-system", "kube-arbiter"), excluded_namespaces=["kube-system"],
            managed=mode)  # type: ignore[arg-type]
        for hook in [*mutating["webhooks"], *validating["webhooks"]]:
            if "namespaceSelector" in hook:
                expressions = hook["namespaceSelector"]["matchExpressions"]
                assert {"key": MANAGED_LABEL, "operator": operator,
                        "values": values} in expressions
