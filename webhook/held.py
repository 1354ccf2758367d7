"""What the pod and Job webhooks both ask of held work: whether a Job is
admitted (by the uid of its unit's consumer, never by name alone), and
what a managed pod spec may not carry because arbiter cannot charge it.
"""

from __future__ import annotations

from arbiter.api import ADMITTED_PHASES, job_unit_name
from arbiter.cache.records import UnitRecord
from webhook.review import AdmissionEnv, Obj, get_list


def admitted_job_unit(env: AdmissionEnv, namespace: str, name: str,
                      uid: str) -> UnitRecord | None:
    """The Job's admitted unit when it was admitted for the Job with this uid.

    A unit named `job-<name>` proves nothing by its name: a reservation a
    tenant made under that name, or the unit a deleted Job of that name
    left behind, stands for no Job of this uid."""
    unit = env.store.units.get(f"{namespace}/{job_unit_name(name)}")
    if unit is None or unit.phase not in ADMITTED_PHASES or not uid:
        return None
    consumer = unit.consumer
    if consumer is None or consumer.kind != "Job" or consumer.uid != uid:
        return None
    return unit


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
