"""A tenant may not run more than its admission by editing what a held
workload's controller made for it (issue #29, webhook/children.py): a
RayJob's RayCluster, an LWS's leader and worker StatefulSets, a JobSet's
Jobs, a TrainJob's JobSet. The child may ask for what its workload's spec
(as the cache holds it) asks for, whoever writes it, and no more; the
controller's own writes (a copy of the workload, a scale-down, metadata)
pass."""

from __future__ import annotations

import copy
from typing import Any

from arbiter.cache.store import ClusterStore
from arbiter.integrations.lws import GROUP_INDEX_LABEL
from tests.webhook.admission_samples import QUEUE_LABEL, Json, job, job_pod, queue_obj
from tests.webhook.test_ray_workloads import KUBERAY, rayjob
from tests.webhook.workload_samples import (
    QUEUED,
    ask,
    cache,
    child_pod,
    held_store,
    jobset,
    lws,
    owned_by,
    pod_template,
    statefulset,
    switch_on,
    workload_unit,
)
from webhook.endpoints import BY_PATH, MANAGED_JOB_CONDITION
from webhook.review import Decision

LWS_CONTROLLER = {"username": "system:serviceaccount:lws-system:lws-controller-manager"}
PLURALS = {"RayCluster": "rayclusters", "StatefulSet": "statefulsets", "Job": "jobs",
           "JobSet": "jobsets"}


def _store(*objects: Json, units: list[Json] | None = None) -> ClusterStore:
    return held_store(*objects, queues=[queue_obj("team-a", namespaces=["team-a"])],
                      namespaces=["team-a"], units=units)


def _update(old: Json, new: Json, store: ClusterStore, user: Json | None = None) -> Decision:
    return ask(f"/webhook/validate/{PLURALS[old['kind']]}", "UPDATE", new, store, old=old,
               user=user)


def _create(obj: Json, store: ClusterStore, user: Json | None = None) -> Decision:
    return ask(f"/webhook/validate/{PLURALS[obj['kind']]}", "CREATE", obj, store, user=user)


def _edited(obj: Json, edit: Any) -> Json:
    new = copy.deepcopy(obj)
    edit(new["spec"])
    return new


def _denied(decision: Decision, *parts: str) -> None:
    assert not decision.allowed, "allowed"
    for part in parts:
        assert part in decision.message, decision.message


# -- a RayJob's RayCluster ----------------------------------------------------------------
ROOT_RAYJOB = rayjob("rj", labels=QUEUED, suspend=False, validating=True)


def _ray(**fields: Any) -> tuple[Json, ClusterStore]:
    """KubeRay's RayCluster for ROOT_RAYJOB (its rayClusterSpec, its labels),
    and a store with both and the RayJob's admitted unit."""
    root = copy.deepcopy(ROOT_RAYJOB)
    root["spec"]["rayClusterSpec"].update(fields)
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
               "metadata": {**copy.deepcopy(root["metadata"]), "name": "rj-abc12",
                            "uid": "rc-uid"},
               "spec": copy.deepcopy(root["spec"]["rayClusterSpec"])}
    cluster = owned_by(cluster, root)
    return cluster, _store(root, cluster, units=[workload_unit(root, "Running")])


def test_a_tenant_cannot_scale_a_rayjobs_worker_group_add_one_or_raise_requests() -> None:
    cluster, store = _ray()
    more = _edited(cluster, lambda s: s["workerGroupSpecs"][0].update(replicas=3))
    _denied(_update(cluster, more, store), 'RayCluster "team-a/rj-abc12"',
            'belongs to RayJob "team-a/rj" (queue "team-a")',
            "pod set 'cpu' (pod template spec.workerGroupSpecs[0].template; sized by its "
            "worker group's replicas, minReplicas, maxReplicas and numOfHosts) would have 3 "
            "pods where the RayJob asks for 2",
            "change the RayJob instead")
    bigger = _edited(cluster, lambda s: s["workerGroupSpecs"][0]["template"]["spec"][
        "containers"][0]["resources"].update(requests={"cpu": "4"}))
    _denied(_update(cluster, bigger, store),
            "spec.workerGroupSpecs[0].template.spec.containers[].resources.requests would "
            "ask for cpu 4, memory 256Mi a pod where the RayJob asks for cpu 1, memory 256Mi")
    extra = _edited(cluster, lambda s: s["workerGroupSpecs"].append(
        {**copy.deepcopy(s["workerGroupSpecs"][0]), "groupName": "gpu"}))
    _denied(_update(cluster, extra, store), "pod set 'gpu'")
    # A head raised the same way.
    head = _edited(cluster, lambda s: s["headGroupSpec"]["template"]["spec"]["containers"][0][
        "resources"].update(requests={"cpu": "3"}))
    _denied(_update(cluster, head, store), "spec.headGroupSpec.template")
    # Whoever asks: the controller's identity buys nothing past the RayJob.
    _denied(_update(cluster, more, store, KUBERAY), "would have 3 pods")


def test_what_the_rayjob_asks_for_and_less_passes() -> None:
    cluster, store = _ray()
    fewer = _edited(cluster, lambda s: s["workerGroupSpecs"][0].update(replicas=1))
    assert _update(cluster, fewer, store).allowed
    assert _update(fewer, cluster, store, KUBERAY).allowed  # back up to the RayJob's 2
    relabelled = copy.deepcopy(cluster)
    relabelled["metadata"]["labels"]["team"] = "x"
    assert _update(cluster, relabelled, store).allowed
    # KubeRay's autoscaler moves replicas inside [min, max]: admitted at max.
    cluster, store = _ray(enableInTreeAutoscaling=True)
    scaled = _edited(cluster, lambda s: s["workerGroupSpecs"][0].update(replicas=8))
    assert _update(cluster, scaled, store).allowed
    ceiling = _edited(cluster, lambda s: s["workerGroupSpecs"][0].update(maxReplicas=9))
    _denied(_update(cluster, ceiling, store), "would have 9 pods where the RayJob asks for 8")
    # A ceiling taken off (2^31-1: unreadable) is no way around it.
    open_ended = _edited(cluster, lambda s: s["workerGroupSpecs"][0].pop("maxReplicas"))
    _denied(_update(cluster, open_ended, store), "cannot read what its new spec asks for")


def test_a_cluster_created_under_a_rayjob_asks_no_more_than_the_rayjob() -> None:
    cluster, store = _ray()
    store.apply("RayCluster", "DELETED", cluster)
    assert _create(cluster, store, KUBERAY).allowed
    forged = _edited(cluster, lambda s: s["workerGroupSpecs"][0].update(replicas=6))
    forged["metadata"]["name"] = "mine"
    _denied(_create(forged, store), "would have 6 pods where the RayJob asks for 2")


# -- an LWS's StatefulSets ----------------------------------------------------------------
ROOT_LWS = lws("serve", labels=QUEUED, validating=True, replicas=2, size=3)


def _lws_children(root: Json = ROOT_LWS) -> tuple[Json, Json, ClusterStore]:
    """The leader StatefulSet (controller: the LWS), the worker StatefulSet of
    group 0 (controller: its leader pod), and a store with the chain."""
    leader = owned_by(statefulset("serve", replicas=2, validating=True), root)
    leader["spec"]["template"] = pod_template(labels=QUEUED)
    leader_pod = child_pod("serve-0", leader, group_index="0", gated=False)
    workers = owned_by(statefulset("serve-0", replicas=2, validating=True), leader_pod)
    workers["spec"]["template"] = pod_template(labels={**QUEUED, GROUP_INDEX_LABEL: "0"})
    store = _store(root, leader, workers,
                   units=[workload_unit(root, "Running", "0"),
                          workload_unit(root, "Running", "1")])
    cache(store, leader_pod)
    return leader, workers, store


def test_a_tenant_cannot_raise_an_lws_statefulsets_replicas_or_requests() -> None:
    leader, workers, store = _lws_children()
    assert QUEUE_LABEL not in leader["metadata"].get("labels", {})  # reviewed all the same
    more_groups = _edited(leader, lambda s: s.update(replicas=3))
    _denied(_update(leader, more_groups, store), 'StatefulSet "team-a/serve"',
            'belongs to LeaderWorkerSet "team-a/serve"',
            "pod set 'main' (pod template spec.template; sized by spec.replicas) would have "
            "3 pods where the LeaderWorkerSet asks for 2",
            "change the LeaderWorkerSet instead")
    more_workers = _edited(workers, lambda s: s.update(replicas=4))
    _denied(_update(workers, more_workers, store), 'StatefulSet "team-a/serve-0"',
            "would have 4 pods where the LeaderWorkerSet asks for 2")
    bigger = _edited(workers, lambda s: s["template"]["spec"]["containers"][0][
        "resources"].update(requests={"cpu": "2"}))
    _denied(_update(workers, bigger, store),
            "spec.template.spec.containers[].resources.requests would ask for cpu 2 a pod "
            "where the LeaderWorkerSet asks for cpu 1")
    _denied(_update(workers, bigger, store, LWS_CONTROLLER), "would ask for cpu 2")


def test_the_lws_controller_follows_its_lws() -> None:
    leader, workers, store = _lws_children()
    fewer = _edited(workers, lambda s: s.update(replicas=1))
    assert _update(workers, fewer, store).allowed
    assert _update(fewer, workers, store, LWS_CONTROLLER).allowed  # back to size - 1
    # The LWS scaled to 3 groups (the cache has it): its leader StatefulSet follows.
    grown = copy.deepcopy(ROOT_LWS)
    grown["spec"]["replicas"] = 3
    cache(store, grown)
    assert _update(leader, _edited(leader, lambda s: s.update(replicas=3)), store,
                   LWS_CONTROLLER).allowed
    # A worker StatefulSet made for a new leader: size - 1 workers.
    store.apply("StatefulSet", "DELETED", workers)
    assert _create(workers, store, LWS_CONTROLLER).allowed
    _denied(_create(_edited(workers, lambda s: s.update(replicas=5)), store), "would have 5 pods")


def test_a_child_is_checked_when_only_its_workloads_integration_is_on() -> None:
    leader, _, store = _lws_children()
    switch_on(store, "lws")  # StatefulSets are not queued on their own here
    more_groups = _edited(leader, lambda s: s.update(replicas=3))
    _denied(_update(leader, more_groups, store), "would have 3 pods where the "
            "LeaderWorkerSet asks for 2")
    assert _update(leader, _edited(leader, lambda s: s.update(replicas=1)), store).allowed
    forged = _edited(leader, lambda s: s.update(replicas=9))
    forged["metadata"]["name"] = "mine"
    _denied(_create(forged, store), "would have 9 pods")
    cluster, store = _ray()
    switch_on(store, "rayjob")
    more = _edited(cluster, lambda s: s["workerGroupSpecs"][0].update(replicas=3))
    _denied(_update(cluster, more, store), "would have 3 pods where the RayJob asks for 2")
    # A StatefulSet of its own, with the integration off, passes untouched.
    own = statefulset("db", labels=QUEUED, validating=True)
    assert _update(own, _edited(own, lambda s: s.update(replicas=9)), store).allowed


def test_the_update_hooks_see_children_without_a_queue_label() -> None:
    assert "ownerReferences.exists(r, has(r.controller) && r.controller)" in \
        MANAGED_JOB_CONDITION
    for plural in ("statefulsets", "rayclusters", "jobsets", "jobs"):
        hook = BY_PATH[f"/webhook/validate/{plural}"].hooks[0]
        assert hook.condition == ("managed-by-arbiter", MANAGED_JOB_CONDITION)


# -- a JobSet's Jobs, a TrainJob's JobSet ---------------------------------------------------
def test_a_jobsets_job_never_grows_while_its_jobset_waits_or_runs() -> None:
    root = jobset("train", labels=QUEUED, suspend=True, validating=True)
    child = owned_by(job("train-workers-0", "team-a", labels=QUEUED, suspend=True,
                         template_labels=QUEUED, validating=True), root)
    for phase in ("Enqueued", "Running"):
        store = _store(root, child, units=[workload_unit(root, phase)])
        wider = _edited(child, lambda s: s.update(parallelism=5, completions=5))
        _denied(_update(child, wider, store), 'Job "team-a/train-workers-0"',
                'belongs to JobSet "team-a/train"',
                "sized by spec.parallelism and spec.completions) would have 5 pods where it had 1")
        # The JobSet controller's merge on resume (placement) asks for nothing more.
        placed = _edited(child, lambda s: s["template"]["spec"].update(
            nodeSelector={"pool": "a"}))
        assert _update(child, placed, store).allowed


def test_a_trainjobs_jobset_may_change_while_it_waits_not_once_admitted() -> None:
    root = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {**jobset("tune", labels=QUEUED, validating=True)["metadata"]},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True}}
    child = owned_by(jobset("tune", suspend=True, validating=True, jobs=(("node", 1),)), root)
    bigger = _edited(child, lambda s: s["replicatedJobs"][0].update(replicas=4))
    waiting = _store(root, child, units=[workload_unit(root, "Enqueued")])
    assert _update(child, bigger, waiting).allowed  # the loop queues 4 pods
    admitted = _store(root, child, units=[workload_unit(root, "Running")])
    _denied(_update(child, bigger, admitted), 'belongs to TrainJob "team-a/tune"',
            "would have 4 pods where the TrainJob asks for 1")


def test_a_job_made_under_an_admitted_jobset_starts_no_more_pods_than_it_admitted() -> None:
    # A one-pod JobSet, admitted and running its pod; a tenant's Job naming
    # the JobSet as its controller (it has the verbs) gets no pod past that.
    root = jobset("train", labels=QUEUED, suspend=False, validating=True,
                  jobs=(("workers", 1),))
    child = owned_by(job("train-workers-0", "team-a", labels=QUEUED, suspend=False,
                         template_labels=QUEUED, validating=True), root)
    forged = owned_by(job("extra", "team-a", labels=QUEUED, suspend=False,
                          template_labels=QUEUED, validating=True), root)
    forged["spec"].update(parallelism=4, completions=4)
    store = _store(root, child, forged, units=[workload_unit(root, "Running")])
    first = job_pod("train-workers-0", "team-a", queue="team-a",
                    job_uid=child["metadata"]["uid"])
    extra = job_pod("extra", "team-a", queue="team-a", job_uid=forged["metadata"]["uid"])
    assert ask("/webhook/validate/pods", "CREATE", extra, store).allowed  # room for one
    first["metadata"]["name"], first["metadata"]["uid"] = "train-workers-0-x", "pod-uid"
    first["spec"]["nodeName"] = "node-1"
    cache(store, first)
    for decide in ("mutate", "validate"):
        _denied(ask(f"/webhook/{decide}/pods", "CREATE", extra, store),
                'pod of Job "team-a/extra" of JobSet "team-a/train": the JobSet already has '
                '1 active pods, as many as queue "team-a" admitted')
