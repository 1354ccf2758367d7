"""Bounded descriptions and comparisons of untrusted JSON values."""

from __future__ import annotations

import random

from arbiter.core.jsonvalues import brief, json_equal


def nested(depth: int, leaf: object = 1) -> object:
    value: object = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_brief_never_recurses_and_stays_short() -> None:
    assert brief(nested(100_000)) == "a list of 1 items"
    assert brief({"a": nested(100_000)}) == "an object of 1 keys"
    assert brief(10**5000).startswith("an integer of")
    assert brief("x" * 10_000) == repr("x" * 40) + "…"
    assert (brief(None), brief(True), brief(3), brief(1.5)) == ("null", "true", "3", "1.5")


def test_json_equal_at_any_depth() -> None:
    assert json_equal(nested(100_000), nested(100_000))
    assert not json_equal(nested(100_000), nested(100_000, leaf=2))
    assert not json_equal(nested(100_000), nested(99_999))
    assert not json_equal({"a": 1}, {"a": True})
    assert not json_equal({"a": 1}, {"b": 1})


def test_json_equal_agrees_with_equality_on_plain_values() -> None:
    rng = random.Random(13)

    def value(depth: int) -> object:
        roll = rng.random()
        if depth > 3 or roll < 0.4:
            return rng.choice([None, "a", "b", 0, 1, 2.5, False])
        if roll < 0.7:
            return [value(depth + 1) for _ in range(rng.randrange(3))]
        return {rng.choice("xyz"): value(depth + 1) for _ in range(rng.randrange(3))}

    for _ in range(2000):
        a, b = value(0), value(0)
        assert json_equal(a, b) == (a == b and repr(a) == repr(b)), (a, b)
        assert json_equal(a, a)
