"""Layers import downward only (DESIGN §1): pure core ← cache ← loop / webhook /
extender ← server / CLI.

Every module's imports are read with `ast` (including imports inside
functions and under `if TYPE_CHECKING:`), so a reader can trust a module's
folder to tell what it may depend on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("arbiter", "webhook", "extender", "certs")

# package prefix -> module prefixes it must not import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "arbiter.core": (
        "arbiter.cache", "arbiter.loop", "arbiter.jobflow", "webhook", "extender",
        "aiohttp", "kubernetes_asyncio", "prometheus_client",
    ),
    "arbiter.cache": (
        "arbiter.loop", "arbiter.jobflow", "webhook", "extender", "aiohttp.web",
    ),
    "webhook": ("arbiter.loop",),
    "extender": ("arbiter.loop",),
}
# The pure core depends on nothing first-party but itself.
FIRST_PARTY = ("arbiter", "webhook", "extender", "certs")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module `source` imports; `from a import b` yields `a` and `a.b`
    (b may be a submodule). Relative imports are resolved against `module`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                keep = len(package) - node.level + (1 if is_package else 0)
                base = ".".join([*package[:keep], *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def all_modules() -> dict[str, set[str]]:
    modules: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = module_name(path)
            modules[name] = imported_modules(
                path.read_text(), name, is_package=path.name == "__init__.py")
    return modules


MODULES = all_modules()


def violations(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{module} imports {imported}"
        for module, imports in MODULES.items() if matches(module, layer)
        for imported in imports if any(matches(imported, bad) for bad in forbidden)
    )


def test_every_package_is_seen() -> None:
    for layer in FORBIDDEN:
        assert any(matches(module, layer) for module in MODULES), layer
    assert "arbiter.cache.store" in MODULES and "extender.state" in MODULES


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer: str) -> None:
    assert violations(layer, FORBIDDEN[layer]) == []


def test_core_imports_only_core() -> None:
    first_party = [
        f"{module} imports {imported}"
        for module, imports in MODULES.items() if matches(module, "arbiter.core")
        for imported in imports
        if any(matches(imported, p) for p in FIRST_PARTY) and not matches(imported, "arbiter.core")
    ]
    assert first_party == []


def test_the_checker_sees_every_kind_of_import() -> None:
    source = """
from typing import TYPE_CHECKING
import aiohttp.web
from aiohttp import web
from . import sibling
from ..loop import units
if TYPE_CHECKING:
    from arbiter.jobflow.dag import Step
def later() -> None:
    import kubernetes_asyncio
"""
    found = imported_modules(source, "arbiter.cache.store")
    assert {"aiohttp.web", "aiohttp", "arbiter.cache.sibling", "arbiter.loop.units",
            "arbiter.jobflow.dag", "kubernetes_asyncio"} <= found
    assert imported_modules("from . import x", "arbiter.cache", is_package=True) >= {
        "arbiter.cache.x"}


# What runs and with which configuration is decided above every component
# (arbiter.app); components get their dependencies passed in.
WIRING = ("arbiter.app", "arbiter.server", "arbiter.config", "arbiter.cli", "arbiter.serve_cli")
COMPONENTS = ("arbiter.loop", "arbiter.jobflow", "webhook", "extender", "certs")


@pytest.mark.parametrize("component", COMPONENTS)
def test_components_never_import_the_wiring(component: str) -> None:
    assert any(matches(module, component) for module in MODULES), component
    assert violations(component, WIRING) == []
