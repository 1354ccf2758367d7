"""Kubernetes quantity parsing and formatting."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arbiter.core.quantities import (
    MAX_VALUE,
    QuantityError,
    format_quantity,
    parse_exact,
    parse_quantity,
)

GI = 2**30


@pytest.mark.parametrize(
    ("resource", "text", "expected"),
    [
        ("cpu", "100m", 100),
        ("cpu", "1", 1000),
        ("cpu", "1.5", 1500),
        ("cpu", "0.1", 100),
        ("cpu", ".5", 500),
        ("cpu", "5.", 5000),
        ("cpu", "+2", 2000),
        ("cpu", "1e3", 1_000_000),
        ("cpu", "1E3", 1_000_000),
        ("cpu", "1e+3", 1_000_000),
        ("cpu", "25e-3", 25),
        ("cpu", "1k", 1_000_000),
        ("cpu", "1n", 1),  # rounds up to the next millicore, as Kubernetes does
        ("cpu", "1u", 1),
        ("cpu", "1.0005", 1001),
        ("cpu", "0", 0),
        ("cpu", "-0", 0),
        ("memory", "1Gi", GI),
        ("memory", "1.5Gi", 3 * GI // 2),
        ("memory", "0.5Ki", 512),
        ("memory", "2Ki", 2048),
        ("memory", "1Ei", 2**60),
        ("memory", "128974848", 128974848),
        ("memory", "129e6", 129_000_000),
        ("memory", "129M", 129_000_000),
        ("memory", "123Mi", 123 * 2**20),
        ("memory", "1G", 10**9),
        ("memory", "1T", 10**12),
        ("memory", "1P", 10**15),
        ("memory", "1E", 10**18),  # E alone is exa, not an exponent
        ("memory", "1.5", 2),  # bytes round up
        ("memory", "100m", 1),
        ("memory", "1e-70", 1),  # tiny amounts round up to one unit
        ("cpu", "1e-999999999", 1),  # ... without computing 10**-999999999
        ("memory", "0e-999999999", 0),
        ("memory", "0e999", 0),
        ("memory", "123456789012345678901234567890e-20", 1234567891),
        ("pods", "110", 110),
        ("nvidia.com/gpu", "8", 8),
    ],
)
def test_parse_valid(resource: str, text: str, expected: int) -> None:
    assert parse_quantity(resource, text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 1",
        "1 ",
        "1\n",
        "1.2.3",
        "1KiB",
        "1ki",
        "1K",  # decimal kilo is lowercase k
        "1kb",
        "1e",
        "1e+",
        "1E-",
        "1e1.5",
        "--1",
        "+-1",
        "-",
        ".",
        "Ki",
        "m",
        "1 Gi",
        "0x10",
        "1_000",
        "1,5",
        "one",
        "∞",
        "١",  # a non-ASCII digit
        "1mi",
        "1Gi1",
    ],
)
def test_parse_rejects_what_kubernetes_rejects(text: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity("memory", text, field="spec.requests.memory")
    message = str(info.value)
    assert message.startswith("spec.requests.memory: ")
    assert repr(text) in message
    assert "\n" not in message


def test_parse_rejects_negative_unless_allowed() -> None:
    with pytest.raises(QuantityError, match="must not be negative"):
        parse_quantity("cpu", "-1")
    assert parse_quantity("cpu", "-1", allow_negative=True) == -1000
    assert parse_quantity("cpu", "-100m", allow_negative=True) == -100


@pytest.mark.parametrize("text", ["1e400", "9223372036854775808", "10Ei", "1e19"])
def test_parse_rejects_out_of_range(text: str) -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity("memory", text)


def test_parse_numbers_from_json_and_yaml() -> None:
    assert parse_quantity("cpu", 2) == 2000
    assert parse_quantity("cpu", 0.5) == 500
    assert parse_quantity("cpu", 0.1) == 100  # the decimal spelling, not binary noise
    assert parse_quantity("memory", 1e3) == 1000
    assert parse_exact(1e-3) == Fraction(1, 1000)
    for bad in (True, None, [1], {"a": 1}, float("nan"), float("inf")):
        with pytest.raises(QuantityError):
            parse_quantity("cpu", bad)  # type: ignore[arg-type]


def test_parse_field_defaults_to_resource_name() -> None:
    with pytest.raises(QuantityError, match=r"^cpu: 'abc' is not a valid quantity"):
        parse_quantity("cpu", "abc")


@pytest.mark.parametrize(
    ("resource", "units", "text"),
    [
        ("cpu", 3000, "3"),
        ("cpu", 1500, "1500m"),
        ("cpu", 100, "100m"),
        ("cpu", 0, "0"),
        ("cpu", 2_000_000, "2k"),
        ("cpu", -250, "-250m"),
        ("memory", 12 * GI, "12Gi"),
        ("memory", 1536 * 2**20, "1536Mi"),
        ("memory", 1000, "1k"),
        ("memory", 1500, "1500"),
        ("memory", 0, "0"),
        ("memory", -GI, "-1Gi"),
        ("ephemeral-storage", 2**40, "1Ti"),
        ("hugepages-2Mi", 2 * 2**20, "2Mi"),
        ("pods", 110, "110"),
        ("pods", 2000, "2k"),
        ("nvidia.com/gpu", 8, "8"),
    ],
)
def test_format(resource: str, units: int, text: str) -> None:
    assert format_quantity(resource, units) == text


@given(
    st.sampled_from(["cpu", "memory", "pods", "nvidia.com/gpu", "ephemeral-storage"]),
    st.integers(min_value=-MAX_VALUE // 1000, max_value=MAX_VALUE // 1000),
)
def test_format_parse_round_trip(resource: str, units: int) -> None:
    text = format_quantity(resource, units)
    assert parse_quantity(resource, text, allow_negative=True) == units


@given(st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False))
def test_parse_cpu_decimal_is_exact(value: object) -> None:
    text = format(value, "f")
    assert parse_quantity("cpu", text) == int(Fraction(text) * 1000)


# -- bounded input (issue 13, item 6): never a ValueError beyond QuantityError --
@pytest.mark.parametrize("text", [
    "1" * 5000,                 # past Python's 4,300-digit int conversion limit
    "1" * 5000 + "m",
    "0." + "1" * 5000,
    "1e" + "1" * 5000,          # the exponent too
    "1e-" + "1" * 5000,
    "0" * 5000 + "1",
])
def test_thousand_digit_quantities_are_bad_quantities(text: str) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity("cpu", text, field="spec.guarantee.cpu")
    message = str(caught.value)
    assert message.startswith("spec.guarantee.cpu: ") and len(message) < 300


def test_huge_integers_are_out_of_range_without_printing_them() -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity("cpu", 10**5000)


def test_a_deeply_nested_value_is_not_a_quantity_and_is_not_printed() -> None:
    nested: object = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(QuantityError) as caught:
        parse_quantity("cpu", nested)  # type: ignore[arg-type]
    assert "list" in str(caught.value) and len(str(caught.value)) < 200
