"""What the pod, Job and workload webhooks all ask of held work: whether a
Job is admitted (by the uid of its unit's consumer, never by name alone),
which held workload an object's controller chain reaches (by uid at every
step: DESIGN §13, an ownerRef counts only to a workload held with that
uid), whether that workload's unit is admitted, and what a managed pod
spec may not carry because arbiter cannot charge it.
"""

from __future__ import annotations

from arbiter.cache.records import UnitRecord
from arbiter.cache.workloads import WorkloadRecord
from arbiter.core.api import ADMITTED_PHASES
from webhook.review import AdmissionEnv, MalformedReview, Obj, get_list, text_field


def admitted_job_unit(env: AdmissionEnv, namespace: str, uid: str) -> UnitRecord | None:
    """The admitted unit standing for the Job of this uid, found by that uid
    (the store's index), never by name: a unit named `job-<name>` may be the
    one a deleted Job of that name left behind, and the loop names a Job's
    unit apart when that name is taken."""
    unit = env.store.unit_for_consumer(namespace, uid)
    if unit is None or unit.phase not in ADMITTED_PHASES:
        return None
    return unit if unit.consumer is not None and unit.consumer.kind == "Job" else None


def controller_ref(meta: Obj | None, where: str) -> Obj | None:
    """The object's controller ownerReference (`controller: true`), if any.
    `where` names the metadata in a MalformedReview."""
    if meta is None:
        return None
    refs = get_list(meta, "ownerReferences", f"{where}.ownerReferences") or []
    for index, ref in enumerate(refs):
        if not isinstance(ref, dict):
            raise MalformedReview(f"{where}.ownerReferences[{index}] must be an object")
        if ref.get("controller") is True:
            return ref
    return None


def held_root(env: AdmissionEnv, namespace: str, meta: Obj | None,
              where: str = "request.object.metadata") -> WorkloadRecord | None:
    """The held workload the object's controller chain reaches, checked by
    uid at every step in the cache (`ClusterStore.root_workload`): a uid the
    cache does not know, or a chain that reaches no held workload of an
    integration switched on, counts for nothing (None)."""
    ref = controller_ref(meta, where)
    uid = text_field(ref, "uid")
    if ref is None or not uid:
        return None
    return env.store.root_workload(namespace, text_field(ref, "kind"), uid)


def unit_admitted(env: AdmissionEnv, workload: WorkloadRecord, suffix: str = "") -> bool:
    """Whether the unit of `workload` (one of its units: `suffix`) is
    admitted, for this workload's uid (`ClusterStore.workload_unit`)."""
    unit = env.store.workload_unit(workload, suffix)
    return unit is not None and unit.phase in ADMITTED_PHASES


def workload_admitted(env: AdmissionEnv, workload: WorkloadRecord) -> bool:
    """Whether any of the workload's units is admitted, or (a suspend-held
    kind) it runs: it is unsuspended, which only arbiter does to held work."""
    if workload.integration.hold == "suspend" and not workload.suspended:
        return True
    return any(unit_admitted(env, workload, unit.suffix) for unit in workload.units or ())


def joins_held_root(env: AdmissionEnv, namespace: str, old_meta: Obj | None,
                    new_meta: Obj | None) -> WorkloadRecord | None:
    """The held workload an UPDATE's new controller ownerReference makes the
    object a child of, when the old one did not (or reached another): held
    work may not pass as another workload's (say an admitted one's) by
    rewriting its ownerReferences. Controllers adopt only orphans that are
    not held (ReplicaSets adopt pods; a per-pod Deployment holds none)."""
    new = held_root(env, namespace, new_meta)
    if new is None:
        return None
    old = held_root(env, namespace, old_meta, "request.oldObject.metadata")
    return new if old is None or old.uid != new.uid else None


def joins_message(subject: str, root: WorkloadRecord) -> str:
    return (f"{subject}: metadata.ownerReferences cannot be changed to make it part of "
            f'{root.kind} "{root.key}" (held by kube-arbiter): create it anew instead')


def claims_problem(spec: Obj | None, where: str) -> str | None:
    """Why a pod spec at `where` cannot be queued: it claims devices through
    DRA (`resourceClaims`), which arbiter does not count yet, so a queue
    would be charged nothing for them. None when it claims none."""
    if spec is None:
        return None
    claims = get_list(spec, "resourceClaims", f"{where}.resourceClaims")
    if not claims:
        return None
    return (f"{where}.resourceClaims: kube-arbiter cannot charge devices claimed through "
            "dynamic resource allocation yet, so work in a managed namespace may not claim "
            "them; remove the claims, or run the work in a namespace kube-arbiter does not "
            "manage")
