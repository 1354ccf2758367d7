"""JobSet (`jobset.x-k8s.io/v1alpha2`): held by `spec.suspend`; one unit,
one pod set per replicatedJob of `replicas x min(parallelism, completions)`
pods. The JobSet controller (v0.12) creates its child Jobs suspended while
it is, suspends them again (keeping them) when it is, and on resume merges
each replicatedJob's pod-template labels, annotations, nodeSelector,
tolerations and schedulingGates into its suspended Jobs: a merge only adds
(a key taken off the JobSet stays on a Job that exists). Its webhook lets
only those pod-template fields change, and only while it is suspended."""

from __future__ import annotations

from arbiter.core.api import MAX_POD_SETS
from arbiter.integrations.base import (
    Integration,
    Obj,
    Outcome,
    Path,
    PodSetSpec,
    UnitSpec,
    condition_true,
    count_at,
    dig,
    pods_at_once,
    template_requests,
    whole,
)


class JobSet(Integration):
    name = "jobset"
    group = "jobset.x-k8s.io"
    version = "v1alpha2"
    resource = "jobsets"
    kind = "JobSet"
    prefix = "jobset"
    children = ("Job",)
    sized_by = "its replicatedJob's replicas, parallelism and completions"
    readable = (f"spec.replicatedJobs: 1 to {MAX_POD_SETS} replicated Jobs, each with whole-number "
                "replicas, parallelism and completions and a pod template")

    def _jobs(self, obj: Obj) -> list[tuple[int, str]]:
        jobs = dig(obj, ("spec", "replicatedJobs"))
        if not isinstance(jobs, list):
            return []
        return [(index, str(dig(job, ("name",)) or f"job-{index}"))
                for index, job in enumerate(jobs)]

    def templates(self, obj: Obj) -> tuple[Path, ...]:
        return tuple(("spec", "replicatedJobs", index, "template", "spec", "template")
                     for index, _ in self._jobs(obj))

    def job_templates(self, obj: Obj) -> tuple[Path, ...]:
        """The child Jobs' templates (they carry the queue label too)."""
        return tuple(("spec", "replicatedJobs", index, "template")
                     for index, _ in self._jobs(obj))

    def labelled(self, obj: Obj) -> tuple[Path, ...]:
        return (*self.job_templates(obj), *self.templates(obj))

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        jobs = self._jobs(obj)
        if not jobs or len(jobs) > MAX_POD_SETS:
            return None
        pod_sets = []
        for index, name in jobs:
            base: Path = ("spec", "replicatedJobs", index)
            replicas = count_at(obj, (*base, "replicas"))  # the CRD defaults it to 1
            per_job = pods_at_once(obj, (*base, "template", "spec"))
            template: Path = (*base, "template", "spec", "template")
            requests = template_requests(obj, template)
            if replicas is None or per_job is None or requests is None:
                return None
            count = replicas * per_job
            if count:
                pod_sets.append(PodSetSpec(name, count, requests, template))
        return (UnitSpec("", tuple(pod_sets)),) if pod_sets else ()

    def outcome(self, obj: Obj) -> Outcome | None:
        found = condition_true(obj, ("Completed", "Failed"))
        return "Complete" if found == "Completed" else "Failed" if found else None

    def ready(self, obj: Obj) -> int:
        return jobs_ready(obj, ("status", "replicatedJobsStatus"))


def jobs_ready(obj: Obj, statuses_path: Path) -> int:
    """Child Jobs, not pods, in a JobSet's per-replicatedJob statuses (or a
    copy of them): upstream's `ready` counts the Jobs whose ready and
    succeeded pods reach min(parallelism, completions), `succeeded` the Jobs
    done (`active` is not counted: it includes pending pods)."""
    statuses = dig(obj, statuses_path)
    return sum(whole(dig(status, (key,)))
               for status in (statuses if isinstance(statuses, list) else ())
               for key in ("ready", "succeeded"))
