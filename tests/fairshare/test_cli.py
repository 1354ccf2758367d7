"""`arbiter fairshare FILE`: output format and input validation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from arbiter.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

DRF_EXPECTED = {
    "queues": {
        "A": {
            "admitted": 3,
            "allocated": {"cpu": "3", "memory": "12Gi"},
            "dominantShare": 0.6667,
            "deserved": {"cpu": "3", "memory": "12Gi"},
        },
        "B": {
            "admitted": 2,
            "allocated": {"cpu": "6", "memory": "2Gi"},
            "dominantShare": 0.6667,
            "deserved": {"cpu": "6", "memory": "2Gi"},
        },
    },
    "free": {"cpu": "0", "memory": "4Gi"},
}


def run_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: object, suffix: str = ".yaml"
) -> tuple[int, str, str]:
    path = tmp_path / f"scenario{suffix}"
    if isinstance(document, str):
        path.write_text(document)
    elif suffix == ".json":
        path.write_text(json.dumps(document))
    else:
        path.write_text(yaml.safe_dump(document))
    code = main(["fairshare", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_drf_paper_example_subprocess() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "arbiter", "fairshare", str(EXAMPLES / "drf-paper.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == DRF_EXPECTED
    assert done.stderr == ""


def test_drf_paper_example_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fairshare", str(EXAMPLES / "drf-paper.json")]) == 0
    assert json.loads(capsys.readouterr().out) == DRF_EXPECTED


@pytest.mark.parametrize(
    "example", ["drf-paper.yaml", "drf-paper.json", "weighted-gpu.yaml", "blocking-head.yaml"]
)
def test_examples_run(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fairshare", str(EXAMPLES / example)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"queues", "free"}
    for queue in result["queues"].values():
        assert set(queue) == {"admitted", "allocated", "dominantShare", "deserved"}


def test_order_weights_policies_and_blocking(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    document = {
        "capacity": {"cpu": "10", "memory": "10Gi", "nvidia.com/gpu": 0},
        "queues": [
            {
                "name": "heavy",
                "weight": 2,
                "queuePolicy": "FIFO",
                "units": [{"count": 20, "requests": {"cpu": "500m"}, "name": "w"}],
            },
            {
                "name": "light",
                "units": [
                    {"count": 20, "requests": {"cpu": "500m"}, "priority": 0},
                    {"name": "vip", "requests": {"cpu": "500m"}, "priority": 5},
                ],
            },
            {
                "name": "stuck",
                "blocking": True,
                "capability": {"cpu": "1"},
                "units": [
                    {"requests": {"cpu": "2"}},
                    {"count": 3, "requests": {"cpu": "100m"}},
                ],
            },
        ],
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(document))
    assert main(["fairshare", str(path), "--order"]) == 0
    result = json.loads(capsys.readouterr().out)
    queues = result["queues"]
    assert queues["heavy"]["admitted"] == 13
    assert queues["light"]["admitted"] == 7
    assert queues["stuck"]["admitted"] == 0
    assert queues["heavy"]["allocated"] == {"cpu": "6500m", "memory": "0", "nvidia.com/gpu": "0"}
    assert queues["light"]["dominantShare"] == 0.35
    assert result["free"] == {"cpu": "0", "memory": "10Gi", "nvidia.com/gpu": "0"}
    order: list[str] = result["order"]
    assert order[0] == "heavy/w-0"
    assert order[1] == "light/vip"  # priority first inside its queue
    assert "light/vip" in order and "stuck/unit-1-0" not in order


def test_deserved_over_total_demand(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    document = {
        "capacity": {"cpu": "4"},
        "queues": [
            {"name": "a", "units": [{"count": 1, "requests": {"cpu": "3"}}]},
            {"name": "b", "units": [{"count": 8, "requests": {"cpu": "1"}}]},
        ],
    }
    code, out, _ = run_cli(capsys, tmp_path, document)
    assert code == 0
    result: dict[str, Any] = json.loads(out)
    # Admission: a (share 0) then b; deserved: 2 cpu each (equal dominant shares).
    assert result["queues"]["a"]["admitted"] == 1
    assert result["queues"]["b"]["admitted"] == 1
    assert result["queues"]["a"]["deserved"] == {"cpu": "2"}
    assert result["queues"]["b"]["deserved"] == {"cpu": "2"}


BASE: dict[str, Any] = {
    "capacity": {"cpu": "4", "memory": "8Gi"},
    "queues": [
        {"name": "a", "units": [{"count": 1, "requests": {"cpu": "1"}}]},
        {"name": "b", "units": [{"count": 2, "requests": {"cpu": "1"}}]},
    ],
}


def mutate(path: list[str | int], value: object, *, delete: bool = False) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(json.dumps(BASE))
    target: Any = document
    for step in path[:-1]:
        target = target[step]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return document


BAD_DOCUMENTS: list[tuple[object, str]] = [
    (mutate(["surprise"], 1), "surprise: unknown field"),
    (mutate(["queues", 1, "colour"], "red"), "queues[1].colour: unknown field"),
    (mutate(["queues", 1, "units", 0, "cpus"], 2), "queues[1].units[0].cpus: unknown field"),
    (
        mutate(["queues", 1, "units", 0, "requests", "cpu"], "abc"),
        "queues[1].units[0].requests.cpu: 'abc' is not a valid quantity",
    ),
    (
        mutate(["queues", 0, "units", 0, "requests", "memory"], "1KiB"),
        "queues[0].units[0].requests.memory: '1KiB'",
    ),
    (
        mutate(["queues", 0, "units", 0, "requests", "cpu"], "-1"),
        "queues[0].units[0].requests.cpu: '-1' must not be negative",
    ),
    (mutate(["queues", 0, "guarantee"], {"cpu": "1.2.3"}), "queues[0].guarantee.cpu"),
    (mutate(["queues", 0, "capability"], {"memory": "x"}), "queues[0].capability.memory"),
    (mutate(["capacity", "cpu"], "lots"), "capacity.cpu: 'lots' is not a valid quantity"),
    (mutate(["queues", 0, "weight"], 0), "queues[0].weight: must be a positive integer"),
    (mutate(["queues", 0, "weight"], -2), "queues[0].weight: must be a positive integer"),
    (mutate(["queues", 0, "weight"], 1.5), "queues[0].weight: must be an integer"),
    (mutate(["queues", 0, "weight"], "2"), "queues[0].weight: must be an integer"),
    (mutate(["queues", 0, "weight"], True), "queues[0].weight: must be an integer"),
    (
        mutate(["queues", 1, "units", 0, "count"], -1),
        "queues[1].units[0].count: must be an integer >= 0",
    ),
    (
        mutate(["queues", 1, "units", 0, "count"], 2.5),
        "queues[1].units[0].count: must be an integer",
    ),
    (mutate(["queues", 1, "units", 0, "count"], 10**9), "queues[1].units[0].count: more than"),
    (
        mutate(["queues", 1, "units", 0, "priority"], "high"),
        "queues[1].units[0].priority: must be an integer",
    ),
    (mutate(["queues", 1, "units", 0], "oops"), "queues[1].units[0]: expected a mapping"),
    (
        mutate(["queues", 1, "units", 0, "requests"], None, delete=True),
        "queues[1].units[0].requests: required",
    ),
    (
        mutate(["queues", 1, "units", 0, "requests"], [1]),
        "queues[1].units[0].requests: expected a mapping",
    ),
    (mutate(["queues", 1, "units"], {"count": 1}), "queues[1].units: expected a list"),
    (mutate(["queues", 1, "name"], "a"), "queues[1].name: duplicate queue name 'a'"),
    (mutate(["queues", 1, "name"], None, delete=True), "queues[1].name: required"),
    (mutate(["queues", 1, "name"], ""), "queues[1].name: must be a non-empty string"),
    (mutate(["queues", 1, "blocking"], "yes please"), "queues[1].blocking: must be true or false"),
    (
        mutate(["queues", 1, "queuePolicy"], "LIFO"),
        "queues[1].queuePolicy: must be Priority or FIFO",
    ),
    (mutate(["queues"], {"a": 1}), "queues: expected a list"),
    (mutate(["queues", 0], ["x"]), "queues[0]: expected a mapping"),
    (mutate(["capacity"], None, delete=True), "capacity: required"),
    (mutate(["capacity"], "9 cpus"), "capacity: expected a mapping"),
    ("", "capacity: required"),
    ("[1, 2]", "expected a mapping"),
    ("capacity: {cpu: 1\nqueues: [", "invalid YAML at line"),
]


@pytest.mark.parametrize(("document", "expected"), BAD_DOCUMENTS)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: object, expected: str
) -> None:
    code, out, err = run_cli(capsys, tmp_path, document)
    assert code == 2
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert expected in err, err
    assert "Traceback" not in err


def test_unknown_field_error_starts_with_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_cli(
        capsys, tmp_path, mutate(["queues", 1, "units", 0, "requests", "cpu"], "abc")
    )
    assert code == 2
    assert err.startswith("queues[1].units[0].requests.cpu: 'abc' is not a valid quantity")


def test_bad_json_and_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, tmp_path, '{"capacity": ', suffix=".json")
    assert code == 2 and "invalid JSON at line 1" in err and err.count("\n") == 1
    code = main(["fairshare", str(tmp_path / "nope.yaml")])
    _, err = capsys.readouterr()
    assert code == 2 and "nope.yaml: cannot read" in err and err.count("\n") == 1


def test_bad_input_subprocess_has_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("capacity: {cpu: '9'}\nqueues:\n  - name: a\n    weight: 0\n")
    done = subprocess.run(
        [sys.executable, "-m", "arbiter", "fairshare", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == "queues[0].weight: must be a positive integer, got 0\n"


def test_share_rounding_matches_float_division(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 2469/20000 = 0.12345 exactly: reported as round(2469 / 20000, 4).
    document = {
        "capacity": {"pods": 20000},
        "queues": [{"name": "a", "units": [{"requests": {"pods": 2469}}]}],
    }
    code, out, _ = run_cli(capsys, tmp_path, document)
    assert code == 0
    assert json.loads(out)["queues"]["a"]["dominantShare"] == round(2469 / 20000, 4) == 0.1235


def test_zero_capability_is_a_real_cap(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    scenario = {
        "capacity": {"cpu": "4"},
        "queues": [
            {"name": "a", "capability": {"cpu": "0"},
             "units": [{"count": 2, "requests": {"cpu": "1"}}]},
            {"name": "b", "units": [{"count": 2, "requests": {"cpu": "1"}}]},
        ],
    }
    code, out, _ = run_cli(capsys, tmp_path, scenario)
    result = json.loads(out)
    assert code == 0
    assert result["queues"]["a"]["admitted"] == 0
    assert result["queues"]["b"]["admitted"] == 2
    assert result["queues"]["a"]["deserved"]["cpu"] == "0"


def test_pools_example_places_by_pool_and_explains_waiting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["fairshare", str(EXAMPLES / "pools.yaml")]) == 0
    result = json.loads(capsys.readouterr().out)
    queues = result["queues"]
    assert (queues["narrow"]["admitted"], queues["narrow"]["pools"]) == (2, {"fast": 2})
    assert (queues["wide"]["admitted"], queues["wide"]["pools"]) == (2, {"default": 2})
    assert queues["fragments"]["admitted"] == 1  # the 4 x 300m unit, not the 2 x 1 cpu one
    assert queues["fragments"]["waiting"] == (
        "no node has room: largest free: 100m cpu on small-0; needs 1 cpu per pod for 2 pods"
    )
    assert "waiting" not in queues["wide"]
    assert result["free"] == {"cpu": "2400m", "memory": "40Gi"}


NODE_DOCUMENTS = [
    ({"capacity": {"cpu": "1"}, "nodes": []}, "capacity: not allowed with nodes"),
    ({"nodes": [{"name": "n"}]}, "nodes[0].allocatable: required"),
    ({"nodes": [{"allocatable": {"cpu": "1"}}]}, "nodes[0].name: required"),
    ({"nodes": [{"name": "n", "allocatable": {"cpu": "x"}}]}, "nodes[0].allocatable.cpu"),
    ({"nodes": [{"name": "n", "count": 0, "allocatable": {}}]}, "nodes[0].count"),
    ({"nodes": [{"name": "n", "labels": {"a": 1}, "allocatable": {}}]}, "nodes[0].labels.a"),
    (
        {"nodes": [{"name": "n", "count": 2, "allocatable": {}},
                   {"name": "n-1", "allocatable": {}}]},
        "nodes[1].name: duplicate node name 'n-1'",
    ),
    ({"nodes": [], "pools": [{"name": "default"}]}, "pools[0].name"),
    ({"capacity": {}, "pools": []}, "pools: needs nodes"),
    ({"nodes": [], "queues": [{"name": "a", "pools": ["gpu"]}]},
     "queues[0].pools[0]: unknown pool"),
    ({"capacity": {}, "queues": [{"name": "a", "nodeSelector": {}}]},
     "queues[0].nodeSelector: needs top-level nodes"),
    ({"capacity": {}, "queues": [{"name": "a", "units": [{"pods": 0, "requests": {}}]}]},
     "queues[0].units[0].pods"),
]


@pytest.mark.parametrize(("document", "expected"), NODE_DOCUMENTS)
def test_bad_node_input_exits_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: object, expected: str
) -> None:
    code, out, err = run_cli(capsys, tmp_path, document)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and expected in err, err


def test_pods_per_unit_without_nodes_only_scale_the_demand(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    unit = {"count": 3, "pods": 2, "requests": {"cpu": "1"}}
    document = {"capacity": {"cpu": "4"}, "queues": [{"name": "a", "units": [unit]}]}
    code, out, _ = run_cli(capsys, tmp_path, document)
    assert code == 0
    assert json.loads(out)["queues"]["a"]["admitted"] == 2
    assert "pools" not in json.loads(out)["queues"]["a"]
