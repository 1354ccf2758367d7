"""batch/v1 Job: held by `spec.suspend`; one unit of `min(parallelism,
completions)` pods, as `arbiter.cache.convert.job_from_api` counts them
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
    dig,
    pods_at_once,
    template_requests,
    whole,
)


class Job(Integration):
    name = "job"
    group = "batch"
    version = "v1"
    resource = "jobs"
    kind = "Job"
    prefix = "job"
    children = ("Pod",)
    sized_by = "spec.parallelism and spec.completions"

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        count = pods_at_once(obj, ("spec",))
        requests = template_requests(obj, ("spec", "template"))
        if count is None or requests is None:
            return None
        if count == 0:
            return ()
        return (UnitSpec("", (PodSetSpec(MAIN_POD_SET, count, requests,
                                         ("spec", "template")),)),)

    def outcome(self, obj: Obj) -> Outcome | None:
        found = condition_true(obj, ("Complete", "Failed"))
        return "Complete" if found == "Complete" else "Failed" if found else None

    def ready(self, obj: Obj) -> int:
        # A Job's status counts ready pods in `ready` (it has no readyReplicas).
        return whole(dig(obj, ("status", "ready")))


class Pod(Integration):
    """A plain pod (its own unit) and a pod group (pods sharing the
    `arbiter.dev/pod-group` label): held by the admission gate."""

    name = "pod"
    version = "v1"
    resource = "pods"
    kind = "Pod"
    prefix = "pod"
    hold = "gate"
    per_pod = True

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        return ()

    def ready(self, obj: Obj) -> int:
        # A pod has no readyReplicas: its Ready condition.
        return 1 if condition_true(obj, ("Ready",)) else 0
