"""`arbiter flow`: the DAG tree and the command wiring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from arbiter.cache.jobflow_records import parse_flow_spec
from arbiter.cli.main import build_parser, main
from arbiter.jobflow.cli import render_flow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jobflow"


def flow_obj() -> dict[str, Any]:
    return {
        "metadata": {"name": "demo", "namespace": "ml"},
        "spec": {"flows": [
            {"name": "a"},
            {"name": "b", "dependsOn": {"targets": ["a"]}},
            {"name": "c", "dependsOn": {"targets": ["b"]}},
            {"name": "d", "dependsOn": {"targets": ["b"]}},
            {"name": "e", "dependsOn": {"targets": ["c", "d"]}},
        ]},
        "status": {
            "state": {"phase": "Running"}, "progress": "2/5",
            "steps": [
                {"name": "a", "phase": "Succeed", "jobName": "demo-a", "restartCount": 0,
                 "runningDuration": "12s", "history": [{"attempt": 0}]},
                {"name": "b", "phase": "Succeed", "jobName": "demo-b-r1", "restartCount": 1,
                 "runningDuration": "1m0s", "history": [{"attempt": 0}, {"attempt": 1}]},
                {"name": "c", "phase": "Running", "jobName": "demo-c", "restartCount": 0,
                 "history": [{"attempt": 0}]},
                {"name": "d", "phase": "Pending", "jobName": "demo-d", "restartCount": 0,
                 "history": [{"attempt": 0}]},
                {"name": "e", "phase": "Waiting", "jobName": "demo-e", "restartCount": 0,
                 "message": "waiting for c, d"},
            ],
        },
    }


def test_tree_shows_every_step_under_its_targets() -> None:
    assert render_flow(flow_obj()) == (
        "JobFlow ml/demo: Running (2/5 steps succeeded)\n"
        "a  Succeed  (job demo-a, ran 12s)\n"
        "└── b  Succeed  (job demo-b-r1, 1 restart, ran 1m0s)\n"
        "    ├── c  Running  (job demo-c)\n"
        "    │   └── e  Waiting  - waiting for c, d\n"
        "    └── d  Pending  (job demo-d)\n"
        "        └── e  (see above)\n"
    )


def test_tree_of_a_flow_without_status() -> None:
    obj = flow_obj()
    del obj["status"]
    text = render_flow(obj)
    assert text.splitlines()[0] == "JobFlow ml/demo: Pending"
    assert "└── b  Waiting" in text


def test_flow_commands_are_registered() -> None:
    parser = build_parser(["flow", "status", "x"])
    args = parser.parse_args(["flow", "status", "demo", "-n", "ml", "--kubeconfig", "/k"])
    assert (args.name, args.namespace, str(args.kubeconfig)) == ("demo", "ml", "/k")
    args = parser.parse_args(["flow", "from-job", "train", "--name", "t"])
    assert (args.job, args.name) == ("train", "t")
    args = parser.parse_args(["flow", "to-job", "t", "-n", "ml"])
    assert (args.template, args.namespace) == ("t", "ml")


def test_unreachable_cluster_is_an_error_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    code = main(["flow", "status", "demo", "-n", "ml", "--kubeconfig", str(config)])
    assert code == 1
    assert "arbiter flow: JobFlow demo:" in capsys.readouterr().err


def test_example_dag_is_valid() -> None:
    documents = list(yaml.safe_load_all((EXAMPLE / "dag.yaml").read_text()))
    kinds = [d["kind"] for d in documents]
    flows = [d for d in documents if d["kind"] == "JobFlow"]
    assert flows and "JobTemplate" in kinds
    templates = {d["metadata"]["name"] for d in documents if d["kind"] == "JobTemplate"}
    for flow in flows:
        spec = parse_flow_spec(flow["spec"])
        assert {s.template for s in spec.steps} <= templates
