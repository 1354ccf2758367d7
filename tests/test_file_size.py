"""No source file grows past what a newcomer reads in one sitting (issue 12):
the largest file in arbiter/, webhook/, extender/ and certs/ is under 600
lines. The fair-share engine, `arbiter/core/engine/flat.py`, is the one
exception: its algorithms are read as a whole."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("arbiter", "webhook", "extender", "certs")
EXEMPT = frozenset({Path("arbiter/core/engine/flat.py")})
MAX_LINES = 600


def line_counts() -> dict[Path, int]:
    return {
        path.relative_to(ROOT): len(path.read_text().splitlines())
        for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) not in EXEMPT
    }


def test_every_package_is_counted() -> None:
    counts = line_counts()
    for package in PACKAGES:
        assert any(path.parts[0] == package for path in counts), package
    assert not EXEMPT & set(counts)


def test_largest_file_is_under_the_limit() -> None:
    too_long = {str(path): lines for path, lines in line_counts().items() if lines >= MAX_LINES}
    assert too_long == {}
