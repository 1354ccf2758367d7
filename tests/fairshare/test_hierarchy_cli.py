"""`arbiter fairshare` over a tree of queues (DESIGN §11)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from arbiter.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str, str]:
    code = main(["fairshare", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_hierarchy_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, EXAMPLES / "hierarchy.yaml")
    assert code == 0, err
    queues = json.loads(out)["queues"]
    cpu = {name: int(q["allocated"]["cpu"]) for name, q in queues.items()}
    subtree = {name: q["subtree"]["allocated"]["cpu"] for name, q in queues.items()
               if "subtree" in q}
    # org's capability caps its subtree; batch takes the rest.
    assert subtree == {"org": "16", "research": "10", "product": "6"}
    assert cpu["batch"] == 8 and cpu["org"] == 0
    # product orders its teams' units as one FIFO queue; web is capped at 2.
    assert (cpu["web"], cpu["mobile"]) == (2, 4)
    assert cpu["vision"] + cpu["nlp"] == 10 and cpu["nlp"] >= 2
    assert queues["web"]["parent"] == "product" and "parent" not in queues["org"]
    assert queues["org"]["subtree"]["deserved"]["cpu"] == "16"


def _scenario(tmp_path: Path, queues: list[dict[str, Any]]) -> Path:
    path = tmp_path / "tree.yaml"
    path.write_text(yaml.safe_dump({"capacity": {"cpu": "4"}, "queues": queues}))
    return path


@pytest.mark.parametrize(("queues", "message"), [
    ([{"name": "a", "parent": "ghost"}], "queues[0].parent: queue 'ghost' does not exist"),
    ([{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}],
     "queues[0].parent: cycle through 'a'"),
    ([{"name": "p", "units": [{"requests": {"cpu": "1"}}]}, {"name": "c", "parent": "p"}],
     "queues[0].units: queue 'p' is a parent and holds no work of its own; "
     "give its units to its children (c)"),
    ([{"name": "p", "childOrder": "Strict"}],
     "queues[0].childOrder: must be Fair or Queue, got 'Strict'"),
])
def test_bad_trees_exit_2_naming_the_field(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           queues: list[dict[str, Any]], message: str) -> None:
    code, out, err = _run(capsys, _scenario(tmp_path, queues))
    assert (code, out) == (2, "")
    assert err == message + "\n"
