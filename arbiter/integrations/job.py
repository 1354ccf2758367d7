"""batch/v1 Job: held by `spec.suspend`; one unit of `parallelism` pods
(partial admission, runtime-class overhead and JobFlow read more of it: see
`arbiter.loop.units.job_unit`, which the loop uses for Jobs)."""

from __future__ import annotations

from arbiter.core.model import MAIN_POD_SET
from arbiter.integrations.base import (
    Integration,
    Obj,
    Outcome,
    PodSetSpec,
    UnitSpec,
    condition_true,
    count_at,
    template_requests,
)


class Job(Integration):
    name = "job"
    group = "batch"
    version = "v1"
    resource = "jobs"
    kind = "Job"
    prefix = "job"
    children = ("Pod",)
    crd = False

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        parallelism = count_at(obj, ("spec", "parallelism"))
        requests = template_requests(obj, ("spec", "template"))
        if parallelism is None or requests is None:
            return None
        if parallelism == 0:
            return ()
        return (UnitSpec("", (PodSetSpec(MAIN_POD_SET, parallelism, requests,
                                         ("spec", "template")),)),)

    def outcome(self, obj: Obj) -> Outcome | None:
        found = condition_true(obj, ("Complete", "Failed"))
        return "Complete" if found == "Complete" else "Failed" if found else None


class Pod(Integration):
    """A plain pod (its own unit) and a pod group (pods sharing the
    `arbiter.dev/pod-group` label): held by the admission gate."""

    name = "pod"
    version = "v1"
    resource = "pods"
    kind = "Pod"
    prefix = "pod"
    hold = "gate"
    crd = False
    per_pod = True

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        return ()
