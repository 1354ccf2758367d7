"""The README and docs/ hold together: every relative link and #anchor
resolves, every page is reachable, the README stays short. No network."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import compare_report
from tests.deploy.manifests import ROOT

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation (backticks,
    colons, apostrophes, asterisks, ...) dropped, spaces to dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in _prose(page.read_text()):
        match = HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [target for line in _prose(page.read_text())
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line))]


def test_slugs_follow_github_s_rules() -> None:
    assert slug("Reclaim: the exact stopping rule") == "reclaim-the-exact-stopping-rule"
    assert slug("The offline engine: `arbiter fairshare`") == "the-offline-engine-arbiter-fairshare"
    assert slug("Several victims for one *w*") == "several-victims-for-one-w"
    assert slug("1. Decide which namespaces are managed") == "1-decide-which-namespaces-are-managed"
    assert slug("Where arbiter's admission time goes") == "where-arbiters-admission-time-goes"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not checked
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken
    assert links(page) or page.name != "README.md"


# Top-level folders of the repository: a quoted path under one must exist.
TOP = ("arbiter/", "webhook/", "extender/", "certs/", "manifests/", "scripts/", "examples/",
       "tests/", "bench/", "docs/")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_repository_path_exists(page: Path) -> None:
    quoted = {match.group(1).split(":")[0] for match in
              re.finditer(r"`([^`\s]+)`", page.read_text())}
    paths = {path for path in quoted if path.startswith(TOP) and not set(path) & set("{<*")}
    assert not {path for path in paths if not (ROOT / path).exists()}
    assert paths or page.parent == DOCS


def test_the_readme_stays_under_400_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) < 400


def test_every_docs_page_is_linked_from_the_readme_or_the_index() -> None:
    linked = set()
    for page in (ROOT / "README.md", DOCS / "README.md"):
        for target in links(page):
            path = target.partition("#")[0]
            if path:
                linked.add((page.parent / path).resolve())
    pages = {page.resolve() for page in DOCS.glob("*.md")} - {(DOCS / "README.md").resolve()}
    assert pages and pages <= linked, sorted(p.name for p in pages - linked)
    assert (DOCS / "README.md").resolve() in linked


def test_docs_pages_are_named_lower_case_with_dashes() -> None:
    for page in DOCS.iterdir():
        assert page.name == "README.md" or re.fullmatch(
            r"[a-z0-9]+(-[a-z0-9]+)*\.(md|png)", page.name), page.name
        if page.suffix == ".png":  # a screenshot, small: the repository carries it
            assert page.stat().st_size < 150 * 1024, page.name


def test_the_comparison_table_is_written_between_its_markers(tmp_path: Path) -> None:
    doc = tmp_path / "against-kueue.md"
    doc.write_text((DOCS / "against-kueue.md").read_text())
    info = {"machine": "m", "kubernetes": "k", "kueue": "q", "kube-arbiter": "a"}
    result = {"system": "kube-arbiter", "throughput": {"created_per_s": 12.5}}
    compare_report.write_doc(compare_report.table(info, [result]), doc)
    written = doc.read_text()
    block = written[written.index(compare_report.BEGIN):written.index(compare_report.END)]
    assert "- machine: m" in block and "| Jobs created/s (client, 16 in flight) | 12.5 |" in block
    assert "| 15.3 |" not in block  # the previous run's table is gone
    assert written.count(compare_report.BEGIN) == written.count(compare_report.END) == 1
    assert written.endswith((DOCS / "against-kueue.md").read_text().split(compare_report.END)[1])
