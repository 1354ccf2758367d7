"""Kubeflow Trainer v2 TrainJob (`trainer.kubeflow.org/v1alpha1`, Trainer
v2.3): held by `spec.suspend`, one unit, its pod sets those of the JobSet
Trainer renders from it. Facts of Trainer v2.3.0 this relies on:

- Trainer makes one JobSet named as the TrainJob, controlled by it (owner
  reference, `controller: true`), its `spec.suspend` the TrainJob's, and
  renders it again (server-side apply) only while the TrainJob or the
  JobSet is suspended. That JobSet, suspended while arbiter holds the
  TrainJob, spells out every pod (runtime, numNodes, resourcesPerNode,
  initializers merged): the JobSet integration reads its pod sets there
  (`units_from`), so no runtime is reimplemented here. The TrainJob alone
  cannot say (its runtime is another object): no unit until the JobSet is
  seen. The JobSet, its Jobs and pods are the TrainJob's children.
- Placement goes through `spec.runtimePatches`, a list keyed by `manager`:
  Trainer merges each entry's `trainingRuntimeSpec.template.spec` into the
  runtime's JobSet spec (a strategic merge: replicatedJobs by name), and
  its webhook lets the list change only while the TrainJob is suspended
  before or after the write and no Job of its JobSet is active. arbiter's
  entry (manager `arbiter.dev/kube-arbiter`) gives each replicatedJob's
  pod template the pool's nodeSelector and tolerations, in the write that
  unsuspends the TrainJob; Trainer then unsuspends its JobSet with them.
  The merge replaces a pod spec's tolerations list whole: the pool's
  tolerations stand in for a runtime's own.
- Reclaim suspends the TrainJob; Trainer suspends the JobSet, which
  suspends its Jobs (their pods are deleted). Its Jobs are still active
  then, so the entry cannot come off in that write: it stays on the held
  TrainJob, where no pod runs with it, until the next release replaces it
  (or removes it, when that admission places nothing).
- Finished: its Complete or Failed condition (Trainer copies the JobSet's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from arbiter.integrations.base import (
    Integration,
    Obj,
    Outcome,
    Path,
    UnitSpec,
    condition_true,
    dig,
    pointer,
)
from arbiter.integrations.jobset import jobs_ready

# arbiter's entry in spec.runtimePatches (Trainer wants a domain-prefixed path).
MANAGER = "arbiter.dev/kube-arbiter"
PATCHES: Path = ("spec", "runtimePatches")


class TrainJob(Integration):
    name = "trainer"
    group = "trainer.kubeflow.org"
    version = "v1alpha1"
    resource = "trainjobs"
    kind = "TrainJob"
    prefix = "trainjob"
    children = ("JobSet",)
    units_from = "JobSet"
    readable = "a runtimeRef (its pods are read from the JobSet Trainer makes of it)"

    def templates(self, obj: Obj) -> tuple[Path, ...]:
        return ()  # its pod templates live in the runtime and the child JobSet

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        return None  # the child JobSet's (`units_from`)

    def outcome(self, obj: Obj) -> Outcome | None:
        found = condition_true(obj, ("Complete", "Failed"))
        return "Complete" if found == "Complete" else "Failed" if found else None

    def ready(self, obj: Obj) -> int:
        return jobs_ready(obj, ("status", "jobsStatus"))  # Trainer copies the JobSet's

    def placement_ops(self, obj: Obj, pod_sets: Sequence[str], node_selector: Mapping[str, str],
                      tolerations: Sequence[Obj]) -> list[dict[str, Any]]:
        patches = dig(obj, PATCHES)
        entries = patches if isinstance(patches, list) else []
        index = next((i for i, entry in enumerate(entries)
                      if isinstance(entry, Mapping) and entry.get("manager") == MANAGER), None)
        if not pod_sets or not (node_selector or tolerations):
            return [] if index is None else [{"op": "remove", "path": pointer((*PATCHES, index))}]
        pod_spec: dict[str, Any] = {}
        if node_selector:
            pod_spec["nodeSelector"] = dict(node_selector)
        if tolerations:
            pod_spec["tolerations"] = [dict(t) for t in tolerations]
        entry = {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": name, "template": {"spec": {"template": {
                "spec": pod_spec}}}} for name in pod_sets]}}}}
        if index is not None:
            return [{"op": "replace", "path": pointer((*PATCHES, index)), "value": entry}]
        if not isinstance(patches, list):
            return [{"op": "add", "path": pointer(PATCHES), "value": [entry]}]
        return [{"op": "add", "path": pointer((*PATCHES, "-")), "value": entry}]
