"""The sandbox itself: a real control plane whose fake nodes run Jobs to completion."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, NodeShape, Sandbox
from arbiter.sandbox import process as sandbox_process
from arbiter.sandbox.cluster import repo_root


def _wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


def _get(sandbox: Sandbox, *args: str) -> Any:
    return json.loads(sandbox.kubectl("get", *args, "-o", "json").stdout)


def _timestamp(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_all_fake_nodes_become_ready(sandbox: Sandbox) -> None:
    expected = sandbox.node_shape.count
    nodes = _get(sandbox, "nodes", "-l", "type=kwok")["items"]
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
    namespace = f"sandbox-e2e-{uuid.uuid4().hex[:6]}"
    sandbox.apply_yaml(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "labels": {"arbiter.dev/managed": "false"}},
            }
        )
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "two-pods", "namespace": namespace},
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
            found: dict[str, Any] = _get(sandbox, "job", "two-pods", "-n", namespace)
            conditions = found.get("status", {}).get("conditions", [])
            done = any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)
            return found if done else None

        finished = _wait_for("the Job to complete", complete, timeout=60)
        assert finished["status"]["succeeded"] == 2
        # kwok held each pod Running for the annotated 2 s before completing it.
        started = _timestamp(finished["status"]["startTime"])
        completed = _timestamp(finished["status"]["completionTime"])
        assert completed - started >= dt.timedelta(seconds=2)

        pods = _get(sandbox, "pods", "-n", namespace, "-l", "job-name=two-pods")["items"]
        assert len(pods) == 2
        for pod in pods:
            assert pod["spec"]["nodeName"].startswith("kwok-node-")
            assert pod["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
            assert pod["status"]["phase"] == "Succeeded"
    finally:
        sandbox.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_up_again_is_harmless(sandbox: Sandbox) -> None:
    pids = {name: record.pid for name, record in sandbox.processes().items()}
    again = Sandbox(sandbox.dir, quiet=True)
    assert again.up(sandbox.node_shape, arbiter=sandbox.arbiter_port is not None) is False
    assert {name: record.pid for name, record in again.processes().items()} == pids


def test_status_command_reports_healthy(sandbox: Sandbox) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "arbiter", "sandbox", "status", "--dir", str(sandbox.dir), "--json"],
        capture_output=True,
        text=True,
        cwd=repo_root(),
        timeout=60,
    )
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
        assert not Path(f"/proc/{record.pid}").exists(), f"{record.name} pid {record.pid} remains"
    assert not (tmp_path / "small" / "state.json").exists()
    status = subprocess.run(
        [sys.executable, "-m", "arbiter", "sandbox", "status", "--dir", str(tmp_path / "small")],
        capture_output=True,
        text=True,
        cwd=repo_root(),
        timeout=60,
    )
    assert status.returncode == 1
