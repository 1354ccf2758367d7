"""Reading the manifests/ directory for the deploy tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"

Obj = dict[str, Any]


def documents(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomization(directory: Path = MANIFESTS) -> Obj:
    loaded: Obj = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return loaded


def base_objects() -> list[Obj]:
    """Every object the base's resources list, in order (no kustomize run)."""
    objects: list[Obj] = []
    for resource in kustomization()["resources"]:
        objects += documents(MANIFESTS / resource)
    return objects


def one(kind: str, name: str | None = None) -> Obj:
    found = [o for o in base_objects()
             if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in the base"
    return found[0]


def container(deployment: Obj) -> Obj:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    found: Obj = containers[0]
    return found


def env(deployment: Obj) -> dict[str, str]:
    """The container's plain (value) environment variables."""
    return {e["name"]: e["value"] for e in container(deployment).get("env", []) if "value" in e}


def yaml_blocks(page: Path, until: str | None = None) -> list[str]:
    """The ```yaml blocks of a Markdown page, in order (those before the
    heading line `until` only, when given)."""
    text = page.read_text()
    if until is not None:
        text = text.split(f"\n{until}\n")[0]
    return [block.split("```", 1)[0] for block in text.split("```yaml\n")[1:]]
