"""The immutable resource vector."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arbiter.core.quantities import QuantityError
from arbiter.core.resources import EMPTY, Resources

GI = 2**30

vectors = st.dictionaries(
    st.sampled_from(["cpu", "memory", "pods", "nvidia.com/gpu"]),
    st.integers(min_value=-50, max_value=50),
).map(Resources)


def test_zero_entries_are_dropped_and_equality() -> None:
    r = Resources({"cpu": 1000, "memory": 0})
    assert dict(r) == {"cpu": 1000}
    assert r == {"cpu": 1000, "memory": 0}
    assert r == Resources([("cpu", 1000)])
    assert r != Resources({"cpu": 999})
    assert r != "cpu"
    assert hash(r) == hash(Resources({"cpu": 1000}))
    assert len(r) == 1 and "cpu" in r and "memory" not in r
    assert r.get_amount("memory") == 0
    assert list(r.keys()) == ["cpu"] and list(r.values()) == [1000]
    assert list(r.items()) == [("cpu", 1000)]
    assert EMPTY.is_zero() and not r.is_zero()


def test_arithmetic() -> None:
    a = Resources({"cpu": 3000, "memory": 4 * GI})
    b = Resources({"cpu": 1000, "pods": 1})
    assert a + b == Resources({"cpu": 4000, "memory": 4 * GI, "pods": 1})
    assert a - b == Resources({"cpu": 2000, "memory": 4 * GI, "pods": -1})
    assert (a - a).is_zero()
    assert (a - b).has_negative() and not a.has_negative()
    assert (a - b).clamp_min() == Resources({"cpu": 2000, "memory": 4 * GI})
    assert a.scale(3) == Resources({"cpu": 9000, "memory": 12 * GI})
    assert a.scale(0) == EMPTY
    assert a.minimum(b) == Resources({"cpu": 1000})
    assert a.maximum(b) == Resources({"cpu": 3000, "memory": 4 * GI, "pods": 1})
    assert a + EMPTY is a


def test_fits_in_and_within_caps() -> None:
    demand = Resources({"cpu": 2000, "nvidia.com/gpu": 1})
    assert demand.fits_in({"cpu": 2000, "nvidia.com/gpu": 1})
    assert not demand.fits_in({"cpu": 2000})  # absent means none
    assert demand.within_caps({"cpu": 2000})  # absent means unlimited
    assert not demand.within_caps({"nvidia.com/gpu": 0})
    assert EMPTY.fits_in({})


def test_parse_and_format() -> None:
    r = Resources.parse({"cpu": "1500m", "memory": "12Gi", "pods": 3}, field="spec.requests")
    assert r == Resources({"cpu": 1500, "memory": 12 * GI, "pods": 3})
    assert r.to_quantities() == {"cpu": "1500m", "memory": "12Gi", "pods": "3"}
    assert Resources.parse(None) is EMPTY
    with pytest.raises(QuantityError, match=r"^spec.requests.cpu: 'x' is not a valid quantity"):
        Resources.parse({"cpu": "x"}, field="spec.requests")
    with pytest.raises(QuantityError, match=r"^spec\.requests: expected a map"):
        Resources.parse(["cpu"], field="spec.requests")  # type: ignore[arg-type]
    with pytest.raises(QuantityError, match="resource names must be non-empty strings"):
        Resources.parse({"": "1"}, field="spec.requests")


@given(vectors, vectors, vectors)
def test_group_laws(a: Resources, b: Resources, c: Resources) -> None:
    assert a + b == b + a
    assert (a + b) + c == a + (b + c)
    assert (a + b) - b == a
    assert a.minimum(b) + a.maximum(b) == a + b
    assert a.minimum(b).fits_in(a.maximum(b))
    assert (a + b == a) == b.is_zero()


@given(vectors, vectors)
def test_fits_in_matches_elementwise_definition(a: Resources, b: Resources) -> None:
    expected = all(a.get_amount(r) <= b.get_amount(r) for r in a)
    assert a.fits_in(b) == expected
    assert a.within_caps(b) == all(a[r] <= b[r] for r in a if r in b)


def test_keep_zero_keeps_explicit_zero_limits() -> None:
    limit = Resources.parse({"cpu": "0", "memory": "1Gi"}, keep_zero=True)
    assert "cpu" in limit and limit["cpu"] == 0
    assert "cpu" not in Resources.parse({"cpu": "0"})
    # Arithmetic results are ordinary vectors again.
    assert "cpu" not in limit + Resources({"memory": 1})
