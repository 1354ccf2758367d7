"""Template + overlay -> Job, and Job <-> JobTemplate conversion."""

from __future__ import annotations

from typing import Any

from arbiter.core.api import (
    ADMISSION_GATE,
    ATTEMPT_ANNOTATION,
    FLOW_UID_ANNOTATION,
    QUEUE_LABEL,
    STEP_ANNOTATION,
)
from arbiter.jobflow.patch import build_job, job_from_template, merge, template_from_job

TEMPLATE: dict[str, Any] = {
    "parallelism": 1,
    "backoffLimit": 0,
    "template": {
        "metadata": {"labels": {"app": "train"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "trainer:1.0", "args": ["--epochs", "1"],
                 "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                 "resources": {"requests": {"cpu": "100m"}}},
                {"name": "sidecar", "image": "log:1"},
            ],
            "tolerations": [{"key": "x", "operator": "Exists"}],
        },
    },
}


def test_merge_containers_by_name_and_replace_scalar_lists() -> None:
    overlay = {
        "parallelism": 4,
        "template": {"spec": {
            "containers": [{"name": "main", "image": "trainer:2.0", "args": ["--epochs", "9"],
                            "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}]}],
            "tolerations": [{"key": "y", "operator": "Exists"}],
        }},
    }
    result = merge(TEMPLATE, overlay)
    containers = result["template"]["spec"]["containers"]
    main = containers[0]
    assert result["parallelism"] == 4
    assert main["image"] == "trainer:2.0"
    assert main["args"] == ["--epochs", "9"]  # a list of scalars is replaced
    assert main["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "20"},
                           {"name": "C", "value": "3"}]
    assert main["resources"] == {"requests": {"cpu": "100m"}}  # untouched fields stay
    assert containers[1] == {"name": "sidecar", "image": "log:1"}
    assert result["template"]["spec"]["tolerations"] == [{"key": "y", "operator": "Exists"}]
    # The template itself is not modified.
    assert TEMPLATE["template"]["spec"]["containers"][0]["image"] == "trainer:1.0"


def test_merge_null_removes_and_patch_delete_drops_an_item() -> None:
    overlay = {
        "backoffLimit": None,
        "template": {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"},
                                             {"name": "extra", "image": "x"}]}},
    }
    result = merge(TEMPLATE, overlay)
    assert "backoffLimit" not in result
    names = [c["name"] for c in result["template"]["spec"]["containers"]]
    assert names == ["main", "extra"]


def test_build_job_labels_owns_and_names() -> None:
    job = build_job(flow="demo", flow_uid="uid-1", namespace="ns", step="b", attempt=2,
                    name="demo-b-r2", template_spec={**TEMPLATE, "suspend": False},
                    patch={"parallelism": 2}, queue="team-a")
    meta = job["metadata"]
    assert meta["name"] == "demo-b-r2"
    assert meta["namespace"] == "ns"
    assert meta["labels"][QUEUE_LABEL] == "team-a"
    assert job["spec"]["template"]["metadata"]["labels"] == {"app": "train",
                                                             QUEUE_LABEL: "team-a"}
    assert meta["annotations"][FLOW_UID_ANNOTATION] == "uid-1"
    assert meta["annotations"][STEP_ANNOTATION] == "b"
    assert meta["annotations"][ATTEMPT_ANNOTATION] == "2"
    [owner] = meta["ownerReferences"]
    assert owner == {"apiVersion": "arbiter.dev/v1alpha1", "kind": "JobFlow", "name": "demo",
                     "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}
    assert job["spec"]["parallelism"] == 2
    assert "suspend" not in job["spec"]  # the queue decides when it runs


LIVE_JOB: dict[str, Any] = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {
        "name": "train", "namespace": "ml", "uid": "abc", "resourceVersion": "42",
        "creationTimestamp": "2024-01-01T00:00:00Z", "generation": 1,
        "labels": {"team": "a", QUEUE_LABEL: "q", "batch.kubernetes.io/job-name": "train",
                   "job-name": "train", "controller-uid": "abc",
                   "batch.kubernetes.io/controller-uid": "abc"},
        "managedFields": [{"manager": "kubectl"}],
    },
    "spec": {
        "suspend": True,
        "parallelism": 2,
        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "abc"}},
        "template": {
            "metadata": {"creationTimestamp": None, "labels": {
                "app": "train", QUEUE_LABEL: "q", "controller-uid": "abc",
                "batch.kubernetes.io/controller-uid": "abc", "job-name": "train",
                "batch.kubernetes.io/job-name": "train"}},
            "spec": {"containers": [{"name": "main", "image": "x"}],
                     "restartPolicy": "Never",
                     "schedulingGates": [{"name": ADMISSION_GATE}]},
        },
    },
    "status": {"active": 1, "startTime": "2024-01-01T00:00:01Z"},
}


def test_template_from_job_strips_what_the_cluster_added() -> None:
    template = template_from_job(LIVE_JOB)
    assert template["apiVersion"] == "arbiter.dev/v1alpha1"
    assert template["kind"] == "JobTemplate"
    assert template["metadata"] == {"name": "train", "namespace": "ml",
                                    "labels": {"team": "a"}}
    assert "status" not in template
    spec = template["spec"]
    assert "selector" not in spec
    assert "suspend" not in spec
    assert spec["parallelism"] == 2
    assert spec["template"]["metadata"] == {"labels": {"app": "train"}}
    assert "schedulingGates" not in spec["template"]["spec"]
    # Renaming, and the original is untouched.
    assert template_from_job(LIVE_JOB, "other")["metadata"]["name"] == "other"
    assert LIVE_JOB["spec"]["selector"]


def test_manual_selector_is_kept() -> None:
    job = {"metadata": {"name": "j"}, "spec": {
        "manualSelector": True, "selector": {"matchLabels": {"x": "1"}},
        "template": {"metadata": {"labels": {"x": "1"}}, "spec": {}}}}
    assert template_from_job(job)["spec"]["selector"] == {"matchLabels": {"x": "1"}}


def test_job_from_template_round_trips() -> None:
    template = template_from_job(LIVE_JOB)
    job = job_from_template(template, "again")
    assert job["apiVersion"] == "batch/v1"
    assert job["kind"] == "Job"
    assert job["metadata"] == {"name": "again", "namespace": "ml"}
    assert job["spec"] == template["spec"]
