"""The sandbox itself: a real control plane whose fake nodes run Jobs to completion."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, NodeShape, Sandbox
from arbiter.sandbox import process as sandbox_process
from tests.e2e.helpers import (
    get,
    job_complete,
    namespace,
    run_arbiter,
    timestamp,
    unique_name,
    wait_for,
)


def test_all_fake_nodes_become_ready(sandbox: Sandbox) -> None:
    expected = sandbox.node_shape.count
    nodes = get(sandbox, "nodes", "-l", "type=kwok")["items"]
    assert len(nodes) == expected
    assert sandbox.ready_nodes() == expected
    for node in nodes:
        assert node["status"]["allocatable"]["cpu"] == sandbox.node_shape.cpu
        assert node["status"]["allocatable"]["pods"] == "110"
        assert not node["spec"].get("taints"), "fake nodes must be schedulable"
    # The kubectl wrapper in DIR/bin talks to the sandbox by itself.
    wrapper = subprocess.run(
        [str(sandbox.kubectl_path), "get", "nodes", "-o", "name"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert len(wrapper.stdout.split()) == expected


def test_job_in_unmanaged_namespace_is_scheduled_and_completes(sandbox: Sandbox) -> None:
    ns = unique_name("sandbox-e2e")
    sandbox.apply_yaml(json.dumps(namespace(ns, labels={"arbiter.dev/managed": "false"})))
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "two-pods", "namespace": ns},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: "2s"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "work",
                            "image": "example.invalid/work:1",
                            "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
                        }
                    ],
                },
            },
        },
    }
    try:
        sandbox.apply_yaml(json.dumps(job))

        def complete() -> dict[str, Any] | None:
            found: dict[str, Any] = get(sandbox, "job", "two-pods", "-n", ns)
            return found if job_complete(found) else None

        finished = wait_for("the Job to complete", complete, timeout=60)
        assert finished["status"]["succeeded"] == 2
        # kwok held each pod Running for the annotated 2 s before completing it.
        started = timestamp(finished["status"]["startTime"])
        completed = timestamp(finished["status"]["completionTime"])
        assert completed - started >= dt.timedelta(seconds=2)

        pods = get(sandbox, "pods", "-n", ns, "-l", "job-name=two-pods")["items"]
        assert len(pods) == 2
        for pod in pods:
            assert pod["spec"]["nodeName"].startswith("kwok-node-")
            assert pod["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
            assert pod["status"]["phase"] == "Succeeded"
    finally:
        sandbox.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_up_again_is_harmless(sandbox: Sandbox) -> None:
    pids = {name: record.pid for name, record in sandbox.processes().items()}
    again = Sandbox(sandbox.dir, quiet=True)
    assert again.up(sandbox.node_shape, arbiter=sandbox.arbiter_port is not None) is False
    assert {name: record.pid for name, record in again.processes().items()} == pids


def test_status_command_reports_healthy(sandbox: Sandbox) -> None:
    result = run_arbiter("sandbox", "status", "--dir", str(sandbox.dir), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["healthy"] is True
    names = {c["name"] for c in report["components"]}
    assert {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"} <= names


def test_down_leaves_no_process_behind(tmp_path: Path) -> None:
    small = Sandbox(tmp_path / "small", quiet=True)
    try:
        small.up(NodeShape(count=1), arbiter=False, timeout=120)
        records = list(small.processes().values())
        assert len(records) == 5
        assert all(sandbox_process.is_running(r) for r in records)
    finally:
        stopped = small.down()
    assert len(stopped) == 5
    for record in records:
        assert not sandbox_process.is_running(record)
        # Not even a zombie (the pid may name another process by now: pids wrap).
        assert not sandbox_process.remains(record), f"{record.name} pid {record.pid} remains"
    assert not (tmp_path / "small" / "state.json").exists()
    status = run_arbiter("sandbox", "status", "--dir", str(tmp_path / "small"))
    assert status.returncode == 1
