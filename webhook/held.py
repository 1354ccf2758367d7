"""What the pod and Job webhooks both ask of held work: whether a Job is
admitted (by the uid of its unit's consumer, never by name alone), and
what a managed pod spec may not carry because arbiter cannot charge it.
"""

from __future__ import annotations

from arbiter.cache.records import UnitRecord
from arbiter.core.api import ADMITTED_PHASES
from webhook.review import AdmissionEnv, Obj, get_list


def admitted_job_unit(env: AdmissionEnv, namespace: str, uid: str) -> UnitRecord | None:
    """The admitted unit standing for the Job of this uid, found by that uid
    (the store's index), never by name: a unit named `job-<name>` may be the
    one a deleted Job of that name left behind, and the loop names a Job's
    unit apart when that name is taken."""
    unit = env.store.unit_for_consumer(namespace, uid)
    if unit is None or unit.phase not in ADMITTED_PHASES:
        return None
    return unit if unit.consumer is not None and unit.consumer.kind == "Job" else None


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
