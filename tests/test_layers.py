"""Layers import downward only (DESIGN §1), and no two files import each other:

    pure core (`arbiter/core`: model, quantities, engines, reclaim, the CRD API)
      ← plumbing (`arbiter/base`: API client, metrics, rate limits, HTTP listener)
      ← cache (`arbiter/cache`), certs
      ← loop / jobflow / webhook / extender
      ← server (`arbiter/server`), CLIs (`arbiter/cli`, any `cli` module), sandbox
    and `arbiter.testing` (test doubles) only for `tests/` and `bench/`.

Every module's imports are read with `ast`, including imports inside
functions and under `if TYPE_CHECKING:`, so a reader can trust a module's
folder to tell what it may depend on. TYPE_CHECKING-only imports count, in
the layer rules and in the cycle check: a type-only import is still a
dependency a reader must follow, and a circle that only `TYPE_CHECKING`
keeps from failing at import time is still a circle in the design.

`from package import name` depends on the submodule `package.name` when
there is one, else on the package. A module does not depend on the packages
that contain it: Python runs a package's `__init__` before its submodules,
but a package re-exporting its own submodules is not a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("arbiter", "webhook", "extender", "certs")
# Everything here is first-party; the pure core may use none of it but itself.
FIRST_PARTY = PACKAGES
IO_LIBRARIES = ("aiohttp", "kubernetes_asyncio", "prometheus_client",
                "asyncio", "socket", "ssl", "subprocess")
# Each layer is a folder; a layer may import itself and the folders below it.
# The top (`arbiter.server`, `arbiter.cli`, `arbiter.sandbox`, `arbiter.__main__`,
# and a package's own `cli` module) may import anything but the test doubles.
BELOW = {
    "arbiter.core": ("arbiter.core",),
    # Integrations read and write raw objects: pure, like the core.
    "arbiter.integrations": ("arbiter.core", "arbiter.integrations"),
    "arbiter.base": ("arbiter.core", "arbiter.base"),
    "certs": ("arbiter.core", "arbiter.base", "certs"),
    "arbiter.cache": ("arbiter.core", "arbiter.base", "arbiter.integrations", "arbiter.cache"),
    "arbiter.loop": ("arbiter.core", "arbiter.base", "arbiter.integrations", "arbiter.cache",
                     "certs", "arbiter.loop"),
    "arbiter.jobflow": ("arbiter.core", "arbiter.base", "arbiter.integrations", "arbiter.cache",
                        "arbiter.jobflow"),
    # The webhook validates a JobFlow's graph with the jobflow package's own check.
    "webhook": ("arbiter.core", "arbiter.base", "arbiter.integrations", "arbiter.cache", "certs",
                "arbiter.jobflow", "webhook"),
    "extender": ("arbiter.core", "arbiter.base", "arbiter.integrations", "arbiter.cache", "certs",
                 "extender"),
}
TOP = ("arbiter.server", "arbiter.cli", "arbiter.sandbox", "arbiter.__main__")
TESTING = "arbiter.testing"

# TEMPORARY (issue 12): violations that branches merging now remove. The lead
# empties this after merging them; `test_known_violations_still_exist` fails
# as soon as one is fixed, naming the entry to delete. Never add to it.


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool = False,
                     known: Collection[str] = ()) -> set[str]:
    """Every module `source` imports. Relative imports are resolved against
    `module`. `from a import b` yields `a.b` when that is one of the `known`
    modules, `a` when `a` is and `a.b` is not (b is a name in a), and both
    otherwise (a third-party b may be a submodule: `from aiohttp import web`)."""
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
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in known:
                    found.add(submodule)
                elif base in known:
                    found.add(base)
                else:
                    found.update((base, submodule))
    return found


def matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def all_modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    paths = {module_name(path): path
             for package in packages for path in sorted((ROOT / package).rglob("*.py"))}
    return {
        name: imported_modules(path.read_text(), name, path.name == "__init__.py", paths)
        for name, path in paths.items()
    }


MODULES = all_modules()
TESTS_AND_BENCH = all_modules(("tests", "bench"))


def is_top(module: str) -> bool:
    """The server, the CLIs and the sandbox: what wires components or faces a person."""
    return under(*TOP)(module) or module.rsplit(".", 1)[-1] == "cli"


def under(*prefixes: str) -> Callable[[str], bool]:
    return lambda name: any(matches(name, prefix) for prefix in prefixes)


@dataclass(frozen=True)
class Rule:
    """Modules for which `subject` holds never import one for which `forbidden` does."""

    name: str
    subject: Callable[[str], bool]
    forbidden: Callable[[str], bool]


def folder_rule(layer: str, allowed: tuple[str, ...]) -> Rule:
    """First-party imports of `layer` (its top modules excepted) stay within `allowed`."""
    return Rule(f"{layer} imports only {', '.join(allowed)}",
                lambda name: under(layer)(name) and not is_top(name),
                lambda name: under(*FIRST_PARTY)(name) and not under(*allowed)(name))


RULES = (
    *(folder_rule(layer, allowed) for layer, allowed in BELOW.items()),
    Rule("core imports no I/O library", under("arbiter.core"), under(*IO_LIBRARIES)),
    Rule("cache serves no HTTP", under("arbiter.cache"), under("aiohttp.web")),
    Rule("only tests and bench import arbiter.testing",
         lambda name: not under(TESTING)(name), under(TESTING)),
)


def rule_violations(rule: Rule, modules: Mapping[str, set[str]] = MODULES) -> set[str]:
    return {
        f"{module} imports {imported}"
        for module, imports in modules.items() if rule.subject(module)
        for imported in imports if imported != module and rule.forbidden(imported)
    }


def strongly_connected(graph: Mapping[str, Collection[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module,
    each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def one_cycle(graph: Mapping[str, Collection[str]], component: list[str]) -> list[str]:
    """A shortest import path from the component's first module back to itself."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for step in sorted(graph[node]):
                if step not in members or step in came_from:
                    continue
                came_from[step] = node
                if step == start:
                    path = [start]
                    while path[-1] != start or len(path) == 1:
                        path.append(came_from[path[-1]])
                    return path[::-1]
                following.append(step)
        frontier = following
    raise AssertionError(f"no cycle through {component}")


def import_graph(modules: Mapping[str, set[str]] = MODULES) -> dict[str, set[str]]:
    return {module: {i for i in imports if i in modules and i != module}
            for module, imports in modules.items()}


def cycles(modules: Mapping[str, set[str]] = MODULES) -> dict[str, str]:
    """`cycle: a, b, c` (the modules of one circle) -> one path round it."""
    graph = import_graph(modules)
    return {f"cycle: {', '.join(component)}": " -> ".join(one_cycle(graph, component))
            for component in strongly_connected(graph)}


# -- the rules ------------------------------------------------------------------------
def test_every_package_is_seen() -> None:
    for layer in (*BELOW, *TOP, TESTING):
        assert any(matches(module, layer) for module in MODULES), layer
    assert "arbiter.cache.store" in MODULES and "extender.state" in MODULES
    assert any(under(TESTING)(i) for imports in TESTS_AND_BENCH.values() for i in imports)


def test_every_module_is_in_a_layer() -> None:
    """A module directly under `arbiter/` would sit in no folder, so no rule would
    say what it may import: only the package's own `__init__` and `__main__` may."""
    loose = sorted(module for module in MODULES
                   if module.count(".") == 1 and module.startswith("arbiter.")
                   and module != "arbiter.__main__"
                   and not (ROOT / module.replace(".", "/")).is_dir())
    assert loose == []
    unruled = sorted(module for module in MODULES
                     if not any(under(layer)(module) for layer in (*BELOW, *TOP, TESTING)))
    assert unruled == ["arbiter"]


@pytest.mark.parametrize("rule", RULES, ids=[rule.name for rule in RULES])
def test_layer_imports_nothing_above_it(rule: Rule) -> None:
    assert sorted(rule_violations(rule)) == []


def test_no_import_cycle_between_files() -> None:
    found = cycles()
    assert found == {}, "import cycles (break each: move the shared part down a layer):\n" + \
        "\n".join(found.values())


# -- the checker itself -----------------------------------------------------------------
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


def test_from_package_import_resolves_to_the_submodule_or_the_package() -> None:
    known = {"webhook", "webhook.jobs", "arbiter.cache.store"}
    source = "from webhook import jobs, ENDPOINTS\nfrom arbiter.cache.store import Kind\n"
    assert imported_modules(source, "webhook.endpoints", known=known) == {
        "webhook.jobs", "webhook", "arbiter.cache.store"}


def test_rules_catch_a_violation() -> None:
    modules = {
        "arbiter.loop.units": {"arbiter.server.context"},
        "arbiter.jobflow.dag": {"arbiter.loop"},
        "arbiter.core.api": {"arbiter.cache.records", "arbiter.core.resources"},
        "arbiter.jobflow.cli": {"arbiter.server.config"},
        "webhook.pods": {"arbiter.testing.memory"},
        "arbiter.base.metrics": {"arbiter.cache.store"},
        "arbiter.core.model": {"asyncio"},
    }
    found = set().union(*(rule_violations(rule, modules) for rule in RULES))
    assert found == {
        "arbiter.loop.units imports arbiter.server.context",
        "arbiter.jobflow.dag imports arbiter.loop",
        "arbiter.core.api imports arbiter.cache.records",
        "webhook.pods imports arbiter.testing.memory",
        "arbiter.base.metrics imports arbiter.cache.store",
        "arbiter.core.model imports asyncio",
    }


def test_the_cycle_check_finds_and_reports_a_cycle() -> None:
    modules = {"a": {"b"}, "b": {"c", "x"}, "c": {"a"}, "x": set(), "y": {"y", "x"},
               "p": {"q"}, "q": {"p"}}
    assert cycles(modules) == {"cycle: a, b, c": "a -> b -> c -> a", "cycle: p, q": "p -> q -> p"}
    assert cycles({"a": {"b"}, "b": set()}) == {}
