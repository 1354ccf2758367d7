"""`arbiter fairshare` from running units (`running:` or `--from FILE`): the
reclaim moves and the fixpoint; bad input exits 2 naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from arbiter.cli.main import main


def flood(running_in_scenario: bool = True) -> dict[str, Any]:
    """Weights 4, 2, 1 on 10 CPUs; the heaviest runs everything already."""
    queues: list[dict[str, Any]] = [
        {"name": "w4", "weight": 4},
        {"name": "w2", "weight": 2, "units": [{"count": 10, "requests": {"cpu": "1"}}]},
        {"name": "w1", "weight": 1, "units": [{"count": 10, "requests": {"cpu": "1"}}]},
    ]
    if running_in_scenario:
        queues[0]["running"] = [{"count": 10, "requests": {"cpu": "1"}}]
    return {"capacity": {"cpu": "10"}, "queues": queues}


def run(capsys: pytest.CaptureFixture[str], tmp_path: Path, document: object,
        *extra: str) -> tuple[int, Any, str]:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(document))
    code = main(["fairshare", str(path), *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else out, err


def test_running_units_reclaim_to_the_fair_split(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    code, out, _ = run(capsys, tmp_path, flood())
    assert code == 0
    assert {name: q["admitted"] for name, q in out["queues"].items()} == {
        "w4": 5, "w2": 3, "w1": 2}
    moves = out["reclaim"]["moves"]
    assert len(moves) == 5 and out["reclaim"]["converged"] is True
    assert {(m["victim"], m["rule"]) for m in moves} == {("w4", "share")}
    assert sorted(m["taker"] for m in moves) == ["w1", "w1", "w2", "w2", "w2"]
    # The most recently admitted go first (listed last).
    assert [m["unit"] for m in moves] == [f"w4/running/unit-0-{i}" for i in (9, 8, 7, 6, 5)]
    assert out["free"] == {"cpu": "0"}
    # Deserved is over the whole demand, running units included.
    assert out["queues"]["w4"]["deserved"] == {"cpu": "5714m"}


def test_from_file_is_the_same_as_running_lists(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    start = tmp_path / "running.json"
    start.write_text(json.dumps({"w4": [{"count": 10, "requests": {"cpu": "1"}}]}))
    code, apart, _ = run(capsys, tmp_path, flood(False), "--from", str(start))
    assert code == 0
    _, inline, _ = run(capsys, tmp_path, flood())
    assert apart == inline


def test_a_fixpoint_start_moves_nothing(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    document = flood()
    document["queues"][0]["running"] = [{"count": 5, "requests": {"cpu": "1"}}]
    document["queues"][1]["running"] = [{"count": 3, "requests": {"cpu": "1"}}]
    document["queues"][2]["running"] = [{"count": 2, "requests": {"cpu": "1"}}]
    code, out, _ = run(capsys, tmp_path, document)
    assert code == 0 and out["reclaim"] == {"moves": [], "rounds": 1, "converged": True}
    assert [q["admitted"] for q in out["queues"].values()] == [5, 3, 2]


def test_without_running_units_the_output_is_unchanged(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    document = flood(False)
    document["queues"][0]["units"] = [{"count": 10, "requests": {"cpu": "1"}}]
    code, out, _ = run(capsys, tmp_path, document)
    assert code == 0 and "reclaim" not in out
    assert [q["admitted"] for q in out["queues"].values()] == [5, 3, 2]


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["queues"][0].update(running=[{"count": 1}]),
     "queues[0].running[0].requests: required"),
    (lambda d: d["queues"][0].update(running={"count": 1}),
     "queues[0].running: expected a list, got "),
    (lambda d: d["queues"][0].update(running=[{"count": 11, "requests": {"cpu": "1"}}]),
     "running: the running units need more than the capacity of cpu"),
    (lambda d: d["queues"][0].update(running=[{"requests": {"cpu": "1"}, "size": 2}]),
     "queues[0].running[0].size: unknown field"),
])
def test_bad_running_units_exit_2_naming_the_field(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, change: Any, message: str) -> None:
    document = flood()
    change(document)
    code, _, err = run(capsys, tmp_path, document)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1


def test_from_an_unknown_queue_exits_2(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    start = tmp_path / "running.yaml"
    start.write_text("nope: [{requests: {cpu: '1'}}]\n")
    code, _, err = run(capsys, tmp_path, flood(False), "--from", str(start))
    assert code == 2 and "no queue named 'nope'" in err


def fragmented() -> dict[str, Any]:
    """Two 1-CPU nodes, each running two 500m units of `a` (first fit, in the
    order listed); the lower-priority ones, first in victim order, sit on
    different nodes. `b` waits with one 1-CPU unit."""
    running = [{"name": name, "requests": {"cpu": "500m"}, "priority": priority}
               for name, priority in (("x0", 1), ("y1", 0), ("x2", 1), ("y3", 0))]
    return {"nodes": [{"name": "n", "allocatable": {"cpu": "1"}, "count": 2}],
            "queues": [{"name": "a", "running": running},
                       {"name": "b", "units": [{"requests": {"cpu": "1"}}]}]}


def test_with_nodes_the_victims_free_one_node(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    """Reclaim with node fit (DESIGN §10): y3 and y1 would free 1 CPU in
    total but 500m on each node; x2 and y3 free the node b's unit fits on."""
    code, out, _ = run(capsys, tmp_path, fragmented())
    assert code == 0
    assert [m["unit"] for m in out["reclaim"]["moves"]] == ["a/running/y3", "a/running/x2"]
    assert out["queues"]["b"]["admitted"] == 1 and out["queues"]["b"]["pools"] == {"default": 1}
    assert out["queues"]["a"]["admitted"] == 2 and out["reclaim"]["converged"] is True


def test_a_running_unit_no_node_holds_exits_2(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    document = fragmented()
    document["queues"][0]["running"].append({"name": "big", "requests": {"cpu": "2"}})
    code, _, err = run(capsys, tmp_path, document)
    assert code == 2 and err.startswith("running: a/running/big fits on no node")


def test_running_units_run_on_the_nodes_given(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    """`nodes` says where a running unit's pods run (read from a cluster):
    with y1 and y3 together on n-1, they alone free a node for b's unit."""
    document = fragmented()
    for entry, node in zip(document["queues"][0]["running"], ("n-0", "n-1", "n-0", "n-1"),
                           strict=True):
        entry["nodes"] = [node]
    code, out, _ = run(capsys, tmp_path, document)
    assert code == 0
    assert [m["unit"] for m in out["reclaim"]["moves"]] == ["a/running/y3", "a/running/y1"]


@pytest.mark.parametrize(("nodes", "message"), [
    (["n-2"], "queues[0].running[0].nodes: no node named 'n-2' in the scenario"),
    (["n-0", "n-1"], "running.nodes: a/running/x0 has 1 pod(s), 2 node(s) given"),
    ("n-0", "queues[0].running[0].nodes: expected a list of node names"),
])
def test_bad_running_nodes_exit_2_naming_the_field(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, nodes: object, message: str) -> None:
    document = fragmented()
    document["queues"][0]["running"][0]["nodes"] = nodes
    code, _, err = run(capsys, tmp_path, document)
    assert code == 2 and err.startswith(message), err
