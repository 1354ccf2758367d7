"""The README's and docs/' references stay in step with the code."""

from __future__ import annotations

import argparse
import re

from arbiter.base import metrics
from arbiter.cli import serve as serve_cli
from tests.deploy.manifests import ROOT

README = (ROOT / "README.md").read_text()


def _section(title: str, page: str = "README.md") -> str:
    """The section of `page` under heading `title`, down to the next heading
    of its level or above outside code blocks (a page's title: the page)."""
    lines = (ROOT / page).read_text().splitlines()
    fenced, level, start = False, 0, -1
    for index, line in enumerate(lines):
        fenced ^= line.startswith("```")
        hashes = len(line) - len(line.lstrip("#"))
        if fenced or not hashes or line[hashes:hashes + 1] != " ":
            continue
        if start >= 0 and hashes <= level:
            return "\n".join(lines[start:index])
        if start < 0 and line[hashes + 1:] == title:
            level, start = hashes, index
    assert start >= 0, (page, title)
    return "\n".join(lines[start:])


def _serve_options() -> list[argparse.Action]:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    serve_cli.add_parser(subparsers)
    return [a for a in subparsers.choices["serve"]._actions
            if a.option_strings and a.dest != "help"]


def test_the_two_commands_are_the_readme_s_first() -> None:
    section = _section("The two commands")
    assert "scripts/demo.sh" in section and "scripts/test.sh" in section
    assert (ROOT / "scripts" / "demo.sh").stat().st_mode & 0o111
    assert "setup-venv.sh" in (ROOT / "scripts" / "demo.sh").read_text()


def test_configuration_reference_lists_every_serve_flag_and_variable() -> None:
    section = _section("Configuration reference", "docs/configuration.md")
    rows = {m.group(1): m.group(2) for m in
            re.finditer(r"^\| `(--[a-z-]+)` \| `(ARBITER_[A-Z_]+)` \|", section, re.MULTILINE)}
    flags = {a.option_strings[0] for a in _serve_options()}
    assert set(rows) == flags
    for flag, variable in rows.items():
        assert variable == "ARBITER_" + flag[2:].upper().replace("-", "_")


def test_serve_help_documents_every_flag_and_the_variables() -> None:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    serve_cli.add_parser(subparsers)
    text = subparsers.choices["serve"].format_help()
    assert "ARBITER_<FLAG>" in text
    for action in _serve_options():
        assert action.help, action.option_strings
        assert action.option_strings[0] in text
    assert "--reclaim-grace RECLAIM_GRACE" in text
    assert "(default: 30.0)" in text  # defaults are shown


def test_metrics_reference_lists_every_metric() -> None:
    section = _section("Metrics reference", "docs/metrics.md")
    documented = set(re.findall(r"^\| `(arbiter_[a-z_]+)` \|", section, re.MULTILINE))
    exported = {m.name for m in metrics.REGISTRY.collect()}
    # prometheus_client drops a counter's _total suffix from the family name.
    exported = {name + "_total" if f"{name}_total" in documented else name
                for name in exported}
    assert documented == exported


def test_install_section_covers_apply_scheduler_and_verify() -> None:
    section = _section("Install on a real cluster", "docs/install.md")
    assert "kubectl apply --server-side -k manifests/" in section
    assert "manifests/scheduler/kube-scheduler-config.yaml" in section
    assert "kubectl apply --server-side -k manifests/monitoring/" in section
    assert "Verify" in section
    troubleshooting = _section("Troubleshooting", "docs/troubleshooting.md")
    for topic in ("webhook down", "SchedulingGated", "extender"):
        assert topic in troubleshooting


def test_configuration_reference_defaults_are_the_code_s() -> None:
    # Item 18: the README said `--status-qps` defaults to 50 (it is 20).
    section = _section("Configuration reference", "docs/configuration.md")
    cells = {m.group(1): m.group(2) for m in re.finditer(
        r"^\| `(--[a-z-]+)` \| `ARBITER_[A-Z_]+` \| `([^`|]*)` \|", section, re.MULTILINE)}
    defaults = {a.option_strings[0]: a.default for a in _serve_options()}
    checked = 0
    for flag, cell in cells.items():
        default = defaults[flag]
        if isinstance(default, bool) or default is None:
            continue
        if isinstance(default, (int, float)):
            assert float(cell) == float(default), (flag, cell, default)
        else:
            assert cell == str(default), (flag, cell, default)
        checked += 1
    assert checked >= 10 and "--status-qps" in cells


def test_the_queue_resolution_order_is_the_resolver_s() -> None:
    # Item 18: the README put the namespace's label before the Queue listing
    # the namespace; ClusterStore.resolve_queue prefers the listing Queue.
    from arbiter.cache.records import NamespaceRecord
    from arbiter.cache.store import ClusterStore

    store = ClusterStore()
    store.namespaces["ns"] = NamespaceRecord(name="ns", queue_label="from-label")
    store.queue_by_namespace["ns"] = "listing"
    assert store.resolve_queue("ns", {"arbiter.dev/queue": "own"}) == "own"
    assert store.resolve_queue("ns", None) == "listing"
    del store.queue_by_namespace["ns"]
    assert store.resolve_queue("ns", None) == "from-label"
    text = " ".join((ROOT / "docs" / "architecture.md").read_text().split())
    start = text.index("the queue is resolved")
    sentence = text[start:text.index(")", start)]
    assert "label, else the Queue listing the namespace, else the namespace's label" in sentence
