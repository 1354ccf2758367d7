"""Bounded operations on decoded JSON values from untrusted input.

`repr()`, `str()` and `==` recurse through nested lists and objects, so a
value nested ~1,000 deep (which a JSON body of a few KiB can carry) makes
them raise RecursionError; `repr()` of a huge integer is refused. Messages
and comparisons of user-supplied values go through these instead.
"""

from __future__ import annotations

# Longest string shown in a message.
BRIEF_LIMIT = 40
# Larger integers are shown by size only (their repr costs time, and Python
# refuses it past 4,300 digits).
_MAX_SHOWN_BITS = 128


def brief(value: object, limit: int = BRIEF_LIMIT) -> str:
    """A short, non-recursive description of `value` for a one-line message:
    scalars as JSON-ish literals (strings cut at `limit`), containers by kind."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if value.bit_length() > _MAX_SHOWN_BITS:
            return f"an integer of {value.bit_length()} bits"
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        shown = repr(value[:limit])
        return shown if len(value) <= limit else shown + "…"
    if isinstance(value, dict):
        return f"an object of {len(value)} keys" if value else "an empty object"
    if isinstance(value, list):
        return f"a list of {len(value)} items" if value else "an empty list"
    return f"a {type(value).__name__}"


def json_equal(left: object, right: object) -> bool:
    """Deep equality of two decoded JSON values, at any depth (iterative).

    Stricter than `==` on types (true is not 1, 1 is not 1.0): good enough
    for "did this change", where a false "changed" only costs a full check."""
    pending = [(left, right)]
    while pending:
        a, b = pending.pop()
        if a is b:
            continue
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            assert isinstance(b, dict)
            if a.keys() != b.keys():
                return False
            pending.extend((a[key], b[key]) for key in a)
        elif isinstance(a, list):
            assert isinstance(b, list)
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
        elif a != b:
            return False
    return True
