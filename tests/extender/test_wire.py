"""Reading the extender wire format: exact Go field names, case-insensitive,
strict about unknown fields and types, one-line reasons."""

from __future__ import annotations

from typing import Any

import pytest

from extender.wire import BadRequest, parse_extender_args, parse_pod, parse_preemption_args
from tests.extender import builders as b


def test_extender_args_with_node_names_as_the_scheduler_sends_them() -> None:
    pod = b.pod("p", cpu="500m", memory="1Gi", job="train", priority=7)
    args = parse_extender_args(b.extender_args(pod, ["n1", "n2"]))
    assert args.names == ["n1", "n2"]
    assert args.node_cache_capable
    assert args.pod.namespace == "team-a"
    assert args.pod.queue == "a"
    assert args.pod.job_name == "train"
    assert args.pod.priority == 7
    assert dict(args.pod.requests) == {"cpu": 500, "memory": 2**30}


def test_extender_args_with_full_nodes() -> None:
    nodes = [b.node("n1", labels={"pool": "x"}), b.node("n2")]
    args = parse_extender_args(b.extender_args_nodes(b.pod("p"), nodes))
    assert args.names == ["n1", "n2"]
    assert not args.node_cache_capable
    assert args.node_labels is not None
    assert args.node_labels[0]["pool"] == "x"


def test_envelope_keys_are_read_case_insensitively() -> None:
    body = {"pod": b.pod("p"), "NODENAMES": ["n1"], "nodes": None}
    assert parse_extender_args(body).names == ["n1"]
    victims = {"pod": b.pod("p"), "nodenametometavictims": {
        "n1": {"pods": [{"uid": "u1"}], "numpdbviolations": 2}}}
    parsed = parse_preemption_args(victims)
    assert parsed.victims["n1"].pods[0].uid == "u1"
    assert parsed.victims["n1"].pdb_violations == 2


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ([], "expected an object, got an array"),
        ({"Pod": None, "NodeNames": []}, "Pod: required"),
        ({"NodeNames": []}, "Pod: required"),
        ({"Pod": {}, "NodeNames": []}, "metadata.namespace: required"),
        ({"Pod": b.pod("p"), "NodeNames": ["a"], "Bogus": 1}, "unknown field 'Bogus'"),
        ({"Pod": b.pod("p"), "NodeNames": ["a"], "nodenames": ["b"]}, "given twice"),
        ({"Pod": b.pod("p"), "NodeNames": "a"}, "NodeNames: expected an array, got a string"),
        ({"Pod": b.pod("p"), "NodeNames": [1]}, "NodeNames[0]: expected a string"),
        ({"Pod": b.pod("p")}, "one of NodeNames or Nodes is required"),
        ({"Pod": b.pod("p"), "NodeNames": [], "Nodes": {"items": []}}, "both"),
        ({"Pod": b.pod("p"), "Nodes": {"items": [{"metadata": {}}]}}, "metadata.name"),
        ({"Pod": b.pod("p"), "Nodes": {"items": "x"}}, "items: expected an array"),
    ],
)
def test_malformed_extender_args_name_the_problem(body: Any, fragment: str) -> None:
    with pytest.raises(BadRequest) as raised:
        parse_extender_args(body)
    assert fragment in str(raised.value)
    assert "\n" not in str(raised.value)


def _mutated(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    pod = b.pod("p")
    target: Any = pod
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return pod


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        (("metadata", "namespace"), "", "namespace: required"),
        (("metadata", "namespace"), 3, "namespace: required (got a number)"),
        (("metadata", "labels"), {"arbiter.dev/queue": 1}, "labels['arbiter.dev/queue']"),
        (("metadata", "ownerReferences"), [{"kind": 1}], "ownerReferences[0].kind"),
        (("metadata", "creationTimestamp"), "yesterday", "Pod"),
        (("spec", "containers"), "x", "spec.containers: expected an array"),
        (("spec", "containers"), [{"resources": {"requests": {"cpu": "lots"}}}], "lots"),
        (("spec", "containers"), [{"resources": {"requests": {"cpu": "-1"}}}], "negative"),
        (("spec", "containers"), [{"resources": []}], "resources: expected an object"),
        (("spec", "priority"), "high", "spec.priority: expected an integer"),
        (("spec", "priority"), True, "spec.priority: expected an integer, got a boolean"),
        (("spec", "overhead"), [1], "spec.overhead"),
        (("spec", "schedulingGates"), [1], "schedulingGates[0]"),
        (("status",), "Running", "status: expected an object"),
    ],
)
def test_malformed_pods_are_bad_requests(path: tuple[str, ...], value: Any, fragment: str) -> None:
    with pytest.raises(BadRequest) as raised:
        parse_pod(_mutated(path, value))
    assert fragment in str(raised.value)


def test_pod_requests_follow_kubernetes_rules() -> None:
    pod = b.pod("p", cpu="1")
    pod["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"cpu": "3"}}},
    ]
    pod["spec"]["overhead"] = {"cpu": "100m"}
    assert parse_pod(pod).requests.get_amount("cpu") == 3100


def test_preemption_args_with_whole_victim_pods() -> None:
    victim = b.pod("v", queue_name="b", node_name="n1", phase="Running", pod_uid="vu")
    body = {
        "Pod": b.pod("p"),
        "NodeNameToVictims": {"n1": {"Pods": [victim], "NumPDBViolations": 1}},
        "NodeNameToMetaVictims": None,
    }
    parsed = parse_preemption_args(body)
    (only,) = parsed.victims["n1"].pods
    assert only.uid == "vu"
    assert only.pod is not None
    assert only.pod.queue == "b"


@pytest.mark.parametrize(
    ("victims", "fragment"),
    [
        ({"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": ""}]}}}, "UID: must not be empty"),
        ({"NodeNameToMetaVictims": {"n1": {"Pods": [{"Name": "x"}]}}}, "unknown field 'Name'"),
        ({"NodeNameToMetaVictims": {"n1": {"NumPDBViolations": -1}}}, "must not be negative"),
        ({"NodeNameToMetaVictims": {"n1": {"NumPDBViolations": 1.5}}}, "expected an integer"),
        ({"NodeNameToMetaVictims": {"n1": []}}, "expected an object"),
        ({"NodeNameToVictims": {"n1": {"Pods": [{"metadata": {"namespace": "x", "name": "y"}}]}}},
         "metadata.uid: required"),
        ({"NodeNameToVictims": {}, "NodeNameToMetaVictims": {}}, "both"),
    ],
)
def test_malformed_preemption_args(victims: dict[str, Any], fragment: str) -> None:
    with pytest.raises(BadRequest) as raised:
        parse_preemption_args({"Pod": b.pod("p"), **victims})
    assert fragment in str(raised.value)


def test_null_victims_read_as_none() -> None:
    parsed = parse_preemption_args(
        {"Pod": b.pod("p"), "NodeNameToVictims": None, "NodeNameToMetaVictims": {"n1": None}}
    )
    assert parsed.victims["n1"].pods == ()


def test_reasons_are_one_line_even_for_hostile_keys() -> None:
    with pytest.raises(BadRequest) as raised:
        parse_extender_args({"Pod": b.pod("p"), "NodeNames": [], "x\ny" * 50: 1})
    message = str(raised.value)
    assert "\n" not in message
    assert len(message) < 300
