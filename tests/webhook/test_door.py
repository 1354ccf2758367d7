"""Prevention at the door (issue #25, DESIGN §13): what a hostile tenant
tries with the verbs it has in its own namespace, and the denial it gets."""

from __future__ import annotations

import copy
from typing import Any

from arbiter.cache.store import ClusterStore
from arbiter.core.api import POD_GROUP_LABEL
from tests.webhook.admission_samples import (
    ADMISSION_GATE,
    ARBITER_USER,
    JOB_CONTROLLER,
    QUEUE_LABEL,
    Json,
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
from webhook import jobs, pods, queueunits
from webhook.configuration import desired_configurations
from webhook.review import Decision

TENANT = {"username": "alice", "groups": ["tenants", "system:authenticated"]}
JOB_UID = "0b9e0000-0000-4000-8000-000000000001"


def _unit(name: str, phase: str | None, *, uid: str = JOB_UID, kind: str = "Job",
          cpu: str = "1") -> Json:
    spec: Json = {"queue": "team-a", "podSets": [
        {"name": "main", "count": 1, "requests": {"cpu": cpu}}]}
    if kind:
        spec["consumerRef"] = {"apiVersion": "batch/v1", "kind": kind, "namespace": "team-a",
                               "name": name.split("-", 1)[1], "uid": uid}
    return unit_obj(name, "team-a", spec, phase=phase)


def _job(*, suspend: bool = True, parallelism: int = 1, uid: str = JOB_UID) -> Json:
    obj = job("train", "team-a", labels={QUEUE_LABEL: "team-a"}, suspend=suspend,
              template_labels={QUEUE_LABEL: "team-a"}, validating=True)
    obj["metadata"]["uid"] = uid
    obj["spec"]["parallelism"] = parallelism
    return obj


def _store(*, units: list[Json] | None = None, jobs_: list[Json] | None = None) -> ClusterStore:
    return make_store(
        queues=[queue_obj("team-a", namespaces=["team-a"]), queue_obj("team-b")],
        namespaces=[namespace_obj("team-a"), namespace_obj("free", {"arbiter.dev/managed":
                                                                     "false"})],
        units=units, jobs=jobs_)


def _pod_create(pod: Json, *, user: Json | None = None,
                store: ClusterStore | None = None) -> Decision:
    request = parse(review("Pod", "CREATE", pod, user=user or TENANT))
    return pods.validate(request, env_for(store or _store()))


def _tenant_pod(name: str = "web", **labels: str) -> Json:
    return held(kubectl_run_pod(name, "team-a", labels={QUEUE_LABEL: "team-a", **labels},
                                validating=True))


# -- row 2: spec.nodeName --------------------------------------------------------------
def test_node_name_on_create_is_denied_naming_the_field() -> None:
    pod = kubectl_run_pod("pinned", "team-a", labels={QUEUE_LABEL: "team-a"}, validating=True)
    pod["spec"]["nodeName"] = "node-1"
    decision = _pod_create(pod)
    assert not decision.allowed
    assert decision.message.startswith('pod "team-a/pinned": spec.nodeName is set')
    # The mirror annotation is anyone's to write: it exempts nothing by itself.
    pod["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    assert not _pod_create(pod).allowed


def test_kubelets_mirror_pods_and_unmanaged_namespaces_pass() -> None:
    pod = kubectl_run_pod("etcd-node-1", "team-a", validating=True)
    pod["spec"]["nodeName"] = "node-1"
    pod["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    for kubelet in ({"username": "system:node:node-1", "groups": ["system:nodes"]},
                    {"username": "some-node-cert", "groups": ["system:nodes"]}):
        assert _pod_create(pod, user=kubelet).allowed
    free = kubectl_run_pod("pinned", "free", validating=True)
    free["spec"]["nodeName"] = "node-1"
    assert _pod_create(free).allowed


# -- row 14: a later mutating webhook dropped arbiter's patch ---------------------------
def test_ungated_pod_is_denied_unless_arbiter_creates_it() -> None:
    pod = kubectl_run_pod("web", "team-a", labels={QUEUE_LABEL: "team-a"}, validating=True)
    decision = _pod_create(pod)
    assert not decision.allowed
    assert decision.message.startswith(
        f'pod "team-a/web" has no {ADMISSION_GATE} scheduling gate')
    assert _pod_create(pod, user={"username": ARBITER_USER}).allowed
    assert _pod_create(held(pod)).allowed


def test_unsuspended_job_is_denied_unless_arbiter_creates_it() -> None:
    env = env_for(_store())
    running = _job(suspend=False)
    decision = jobs.validate(parse(review("Job", "CREATE", running, user=TENANT)), env)
    assert not decision.allowed
    assert decision.message.startswith('Job "team-a/train" has spec.suspend false')
    arbiter = parse(review("Job", "CREATE", running, user={"username": ARBITER_USER}))
    assert jobs.validate(arbiter, env).allowed
    assert jobs.validate(parse(review("Job", "CREATE", _job(), user=TENANT)), env).allowed


# -- row 10: an ownerRef counts only to a Job admitted with that uid --------------------
def test_pod_claiming_its_own_suspended_job_is_denied() -> None:
    pod = job_pod("train", "team-a", queue="team-a", job_uid=JOB_UID)
    store = _store(jobs_=[_job(suspend=True)], units=[_unit("job-train", "Enqueued")])
    for check in (pods.mutate, pods.validate):
        decision = check(parse(review("Pod", "CREATE", pod, user=TENANT)), env_for(store))
        assert not decision.allowed, check
        assert decision.message.startswith(
            'pod of Job "team-a/train": metadata.ownerReferences names that Job')
        assert 'queue "team-a" has not admitted it yet' in decision.message


def test_pods_of_an_admitted_job_pass_ungated() -> None:
    pod = job_pod("train", "team-a", queue="team-a", job_uid=JOB_UID)
    request = parse(review("Pod", "CREATE", pod, user=JOB_CONTROLLER))
    # Released: the Job is unsuspended in the cache ...
    running = _store(jobs_=[_job(suspend=False)])
    assert pods.mutate(request, env_for(running)).patch == ()
    assert pods.validate(request, env_for(running)).allowed
    # ... or its unit is admitted for this uid before the Job's update arrives.
    admitted = _store(jobs_=[_job()], units=[_unit("job-train", "Dequeued")])
    assert pods.validate(request, env_for(admitted)).allowed
    # A unit of that name admitted for another uid (a deleted Job's) is no proof.
    stale = _store(jobs_=[_job()], units=[_unit("job-train", "Dequeued", uid="old")])
    assert not pods.validate(request, env_for(stale)).allowed


# -- row 3 (door half): a stale or forged job-<name> unit --------------------------------
def test_a_pod_past_an_admitted_jobs_parallelism_is_denied() -> None:
    # The queue was charged for parallelism 2: a third pod naming the Job as
    # its controller is a passenger, whoever creates it; one finished or
    # terminating pod makes room for its replacement.
    running = _job(suspend=False, parallelism=2)
    running["spec"]["completions"] = 4
    store = _store(jobs_=[running])
    first, second, third = (job_pod("train", "team-a", queue="team-a", job_uid=JOB_UID)
                            for _ in range(3))
    for index, pod in enumerate((first, second)):
        pod["metadata"]["name"] = f"train-{index}"
        pod["metadata"]["uid"] = f"pod-uid-{index}"
        pod["status"] = {"phase": "Running"}
        store.apply("Pod", "ADDED", pod)
    assert store.active_job_pods("team-a", JOB_UID) == 2
    request = parse(review("Pod", "CREATE", third, user=JOB_CONTROLLER))
    denied = pods.validate(request, env_for(store))
    assert not denied.allowed
    assert "already has 2 active pods, as many as its spec.parallelism (2)" in denied.message
    first["status"] = {"phase": "Failed"}
    store.apply("Pod", "MODIFIED", first)
    assert pods.validate(request, env_for(store)).allowed
    store.apply("Pod", "DELETED", second)
    assert store.active_job_pods("team-a", JOB_UID) == 0


def test_a_pod_in_another_namespace_naming_a_jobs_uid_is_not_that_jobs_pod() -> None:
    # An ownerRef is any uid its author types: pods in an unmanaged namespace
    # naming team-a's Job as their controller neither fill its parallelism
    # (its own pods would be denied) nor count as its work having started.
    store = _store(jobs_=[_job(suspend=False)])
    forged = job_pod("train", "free", queue=None, job_uid=JOB_UID)
    forged["metadata"].update(name="forged", uid="forged-uid")
    forged["spec"]["nodeName"] = "node-0"
    forged["status"] = {"phase": "Running"}
    store.apply("Pod", "ADDED", forged)
    assert store.active_job_pods("free", JOB_UID) == 1
    assert store.active_job_pods("team-a", JOB_UID) == 0
    assert not store.job_pods_started("team-a", JOB_UID, 0.0)
    own = job_pod("train", "team-a", queue="team-a", job_uid=JOB_UID)
    assert pods.validate(parse(review("Pod", "CREATE", own, user=JOB_CONTROLLER)),
                         env_for(store)).allowed
    own["metadata"].update(name="train-0", uid="pod-uid-0")
    own["spec"]["nodeName"] = "node-0"
    store.apply("Pod", "ADDED", own)
    assert store.job_pods_started("team-a", JOB_UID, 0.0)


def test_a_stale_unit_of_a_deleted_job_does_not_let_its_namesake_start() -> None:
    store = _store(units=[_unit("job-train", "Running", uid="the-deleted-jobs-uid")])
    request = parse(review("Job", "UPDATE", _job(suspend=False), old=_job(), user=TENANT))
    decision = jobs.validate(request, env_for(store))
    assert not decision.allowed
    assert "only kube-arbiter may set spec.suspend to false" in decision.message


def test_users_may_not_create_units_under_the_loops_names() -> None:
    for name in ("job-train", "pod-web", "group-g", "jobset-train", "sts-db", "lws-serve-0",
                 "trainjob-tune"):
        obj = unit_obj(name, "team-a", {"queue": "team-a", "podSets": [
            {"name": "main", "count": 1, "requests": {"cpu": "10m"}}]})
        decision = queueunits.validate(parse(review("QueueUnit", "CREATE", obj, user=TENANT)),
                                       env_for(_store()))
        assert not decision.allowed, name
        assert decision.message.startswith(
            f'QueueUnit "team-a/{name}": metadata.name: names starting with "job-", "pod-", '
            '"group-", "jobset-", "sts-", "lws-", "trainjob-", "raycluster-", "rayjob-" '
            'are kube-arbiter\'s')
    ok = unit_obj("reserve-1", "team-a", {"queue": "team-a", "podSets": [
        {"name": "main", "count": 1, "requests": {"cpu": "10m"}}]})
    assert queueunits.validate(parse(review("QueueUnit", "CREATE", ok, user=TENANT)),
                               env_for(_store())).allowed


# -- row 7: a tenant's edit of a loop-made unit ------------------------------------------
def _edit(old: Json, change: Any, user: Json) -> Decision:
    new = copy.deepcopy(old)
    change(new["spec"])
    return queueunits.validate(parse(review("QueueUnit", "UPDATE", new, old=old, user=user)),
                               env_for(_store()))


def test_a_loop_made_units_spec_is_arbiters_alone() -> None:
    old = _unit("job-train", "Enqueued", cpu="4")
    changes = {
        "podSets": lambda spec: spec["podSets"][0]["requests"].update(cpu="10m"),
        "priority": lambda spec: spec.update(priority=1000),
        "queue": lambda spec: spec.update(queue="team-b"),
        "consumerRef": lambda spec: spec["consumerRef"].update(uid="other"),
    }
    for field, change in changes.items():
        decision = _edit(old, change, TENANT)
        assert not decision.allowed, field
        assert decision.message == (
            f'QueueUnit "team-a/job-train": spec.{field} cannot change: kube-arbiter made this '
            "unit for its consumer and writes its spec (pod sets, queue, priority) from the "
            "consumer only")
        assert _edit(old, change, {"username": ARBITER_USER}).allowed
    # A user's own waiting reservation stays the user's to edit.
    reservation = _unit("reserve-1", "Enqueued", kind="")
    assert _edit(reservation, changes["podSets"], TENANT).allowed


# -- row 11: the labels that say which queue a pod is charged to -------------------------
def _pod_update(old: Json, new: Json, user: Json = TENANT, sub: str = "") -> Decision:
    body = review("Pod", "UPDATE", new, old=old, user=user)
    if sub:
        body["request"]["subResource"] = sub
    return pods.validate(parse(body), env_for(_store()))


def test_relabelling_a_pod_into_another_queue_or_group_is_denied() -> None:
    running = _tenant_pod()
    running["spec"]["schedulingGates"] = []
    running["spec"]["nodeName"] = "node-1"
    for key, value in ((QUEUE_LABEL, "team-b"), (POD_GROUP_LABEL, "g")):
        new = copy.deepcopy(running)
        new["metadata"]["labels"][key] = value
        decision = _pod_update(running, new)
        assert not decision.allowed, key
        before = "'team-a'" if key == QUEUE_LABEL else "null"
        assert decision.message == (
            f'pod "team-a/web" is in queue "team-a": its {key} label cannot change '
            f"({before} to '{value}'); delete and recreate the pod to queue it elsewhere")
        assert _pod_update(running, new, user={"username": ARBITER_USER}).allowed
    other = copy.deepcopy(running)
    other["metadata"]["labels"]["app"] = "v2"
    assert _pod_update(running, other).allowed


def test_the_configuration_sends_relabels_and_resizes() -> None:
    _, validating = desired_configurations(url="https://h", excluded_namespaces=())
    hooks = {hook["name"]: hook for hook in validating["webhooks"]}
    labels = hooks["pod-labels.validate.arbiter.dev"]
    assert labels["rules"][0]["resources"] == ["pods"]
    assert labels["rules"][0]["operations"] == ["UPDATE"]
    expression = labels["matchConditions"][-1]["expression"]
    assert QUEUE_LABEL in expression and POD_GROUP_LABEL in expression
    resize = hooks["pod-resize.validate.arbiter.dev"]
    assert resize["rules"][0]["resources"] == ["pods/resize"]
    assert resize["clientConfig"]["url"] == "https://h/webhook/validate/pods"


# -- row 13: resize, DRA -----------------------------------------------------------------
def test_resize_may_lower_requests_but_not_raise_them() -> None:
    pod = _tenant_pod()
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    bigger = copy.deepcopy(pod)
    bigger["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "6"
    decision = _pod_update(pod, bigger, sub="resize")
    assert not decision.allowed
    assert decision.message == (
        'pod "team-a/web": pods/resize may not raise spec.containers[].resources requests in '
        "a managed namespace (cpu 1 to 6): its queue admitted it at its old size; delete and "
        "recreate the pod to queue the larger size")
    smaller = copy.deepcopy(pod)
    smaller["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"
    assert _pod_update(pod, smaller, sub="resize").allowed
    broken = copy.deepcopy(pod)
    broken["spec"]["containers"] = 5
    decision = _pod_update(pod, broken, sub="resize")
    assert (decision.allowed, decision.code) == (False, 422)
    assert decision.message == 'pod "team-a/web": spec.containers: must be a list'


def test_dra_claims_are_denied_naming_the_field() -> None:
    claims = [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}]
    pod = _tenant_pod()
    pod["spec"]["resourceClaims"] = claims
    decision = _pod_create(pod)
    assert not decision.allowed
    assert decision.message.startswith(
        'pod "team-a/web": spec.resourceClaims: kube-arbiter cannot charge devices')
    obj = _job()
    obj["spec"]["template"]["spec"]["resourceClaims"] = claims
    decision = jobs.validate(parse(review("Job", "CREATE", obj, user=TENANT)),
                             env_for(_store()))
    assert not decision.allowed
    assert decision.message.startswith("spec.template.spec.resourceClaims: kube-arbiter cannot")


# -- row 5: demand after admission -------------------------------------------------------
def _scale(old: Json, parallelism: int, store: ClusterStore,
           suspend: bool | None = None) -> Decision:
    new = copy.deepcopy(old)
    new["spec"]["parallelism"] = parallelism
    if suspend is not None:
        new["spec"]["suspend"] = suspend
    return jobs.validate(parse(review("Job", "UPDATE", new, old=old, user=TENANT)),
                         env_for(store))


def test_an_admitted_jobs_parallelism_may_not_rise() -> None:
    running = _job(suspend=False, parallelism=1)
    store = _store(units=[_unit("job-train", "Running")])
    decision = _scale(running, 8, store)
    assert not decision.allowed
    assert decision.message == (
        'Job "team-a/train" was admitted by queue "team-a" for spec.parallelism 1: '
        "spec.parallelism cannot be raised (8) after admission; lower it, or delete and "
        "recreate the Job to queue the larger size")
    assert _scale(_job(suspend=False, parallelism=4), 2, store).allowed
    # Admitted but not yet started (the unit is Dequeued): no growing either.
    assert not _scale(_job(), 8, _store(units=[_unit("job-train", "Dequeued")])).allowed
    # Waiting: free to change; the loop queues the new size.
    assert _scale(_job(), 8, _store(units=[_unit("job-train", "Enqueued")])).allowed
