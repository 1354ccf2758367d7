"""The TrainJob kind (Kubeflow Trainer v2.3): held by spec.suspend, no unit
from its own spec (its JobSet's), finished from its conditions, placed
through arbiter's own spec.runtimePatches entry."""

from __future__ import annotations

from typing import Any

from arbiter.integrations import BY_KIND, BY_NAME
from arbiter.integrations.trainjob import MANAGER, TrainJob
from arbiter.testing.memory import json_patch

KIND = TrainJob()
GPU = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}


def trainjob(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "tune", "namespace": "ml", "uid": "tj"},
            "spec": {"runtimeRef": {"name": "torch-distributed"},
                     "trainer": {"numNodes": 2}, **spec}}


def user_patch() -> dict[str, Any]:
    return {"manager": "example.com/tenant", "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
            "metadata": {"annotations": {"a": "b"}}}}}}]}}}}


def placed(obj: dict[str, Any], *names: str, selector: dict[str, str] | None = None,
           tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    ops = KIND.placement_ops(obj, names, selector or {}, tolerations or [])
    result: dict[str, Any] = json_patch(obj, ops)
    return result


def test_registered_as_trainer_with_its_api_and_its_jobset_as_child() -> None:
    assert BY_NAME["trainer"] is BY_KIND["TrainJob"]
    assert KIND.api_version == "trainer.kubeflow.org/v1alpha1"
    assert KIND.object_path("ml", "tune") == \
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/tune"
    assert (KIND.prefix, KIND.units_from, KIND.children) == ("trainjob", "JobSet", ("JobSet",))


def test_its_own_spec_gives_no_unit_and_no_template() -> None:
    assert KIND.units(trainjob()) is None
    assert KIND.templates(trainjob()) == () == KIND.labelled(trainjob())


def test_held_by_spec_suspend() -> None:
    assert KIND.suspended(trainjob(suspend=True))
    assert not KIND.suspended(trainjob(suspend=False)) and not KIND.suspended(trainjob())
    assert json_patch(trainjob(), KIND.suspend_ops(True))["spec"]["suspend"] is True


def test_finished_from_its_complete_or_failed_condition() -> None:
    def with_conditions(*types: str, status: str = "True") -> dict[str, Any]:
        return {**trainjob(), "status": {"conditions": [
            {"type": t, "status": status} for t in types]}}
    assert KIND.outcome(with_conditions("Complete")) == "Complete"
    assert KIND.outcome(with_conditions("Failed")) == "Failed"
    assert KIND.outcome(with_conditions("Suspended", "Created")) is None
    assert KIND.outcome(with_conditions("Complete", status="False")) is None


def test_ready_counts_its_jobs_ready_or_succeeded() -> None:
    obj = {**trainjob(), "status": {"jobsStatus": [
        {"name": "node", "ready": 1, "succeeded": 1, "active": 2, "failed": 0},
        {"name": "init", "ready": True, "succeeded": "2"}]}}
    assert KIND.ready(obj) == 2  # a bool or a string is no count
    assert KIND.ready(trainjob()) == 0


def test_placement_adds_its_own_runtime_patch_per_pod_set() -> None:
    obj = placed(trainjob(), "node", "init", selector={"pool": "gpu"}, tolerations=[GPU])
    (entry,) = obj["spec"]["runtimePatches"]
    assert entry["manager"] == MANAGER
    jobs = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert [job["name"] for job in jobs] == ["node", "init"]
    assert all(job["template"]["spec"]["template"]["spec"] ==
               {"nodeSelector": {"pool": "gpu"}, "tolerations": [GPU]} for job in jobs)


def test_placement_keeps_the_users_patches_and_replaces_only_its_own() -> None:
    obj = placed(trainjob(runtimePatches=[user_patch()]), "node", selector={"pool": "a"})
    assert [p["manager"] for p in obj["spec"]["runtimePatches"]] == \
        ["example.com/tenant", MANAGER]
    obj = placed(obj, "node", selector={"pool": "b"})
    assert obj["spec"]["runtimePatches"][0] == user_patch()
    (ours,) = obj["spec"]["runtimePatches"][1:]
    pod = ours["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert pod["template"]["spec"]["template"]["spec"] == {"nodeSelector": {"pool": "b"}}


def test_placing_nothing_takes_its_entry_off_and_leaves_the_rest() -> None:
    obj = placed(trainjob(runtimePatches=[user_patch()]), "node", selector={"pool": "a"})
    obj = placed(obj, "node")
    assert obj["spec"]["runtimePatches"] == [user_patch()]
    assert KIND.placement_ops(trainjob(), ["node"], {}, []) == []
    assert KIND.placement_ops(trainjob(), [], {"pool": "a"}, []) == []
