"""Exact Kubernetes quantities as integers.

CPU is held in millicores, every other resource in base units (bytes,
counts). Parsing follows the apiserver's grammar: a signed decimal number
followed by a binary suffix (Ki..Ei), a decimal suffix (n, u, m, "", k..E) or
a decimal exponent (e3, E-2). A fractional result rounds up to the next whole
unit, as Kubernetes' `MilliValue()`/`Value()` do, so a request never shrinks.
"""

from __future__ import annotations

import re
from fractions import Fraction

# Resources held in thousandths (millicores) rather than whole units.
MILLI_RESOURCES = frozenset({"cpu"})

# Names whose canonical form prefers binary suffixes (1Gi rather than 1073741824).
_BINARY_PREFERRED_PREFIXES = ("memory", "ephemeral-storage", "hugepages-", "storage")

_BINARY_SUFFIXES: dict[str, int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL_EXPONENTS: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}

_QUANTITY_RE = re.compile(
    r"^(?P<sign>[+-]?)"
    r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)"
    r"|[eE](?P<exponent>[+-]?[0-9]+)"
    r"|(?P<decimal>[numkMGTPE]?))$"
)

# Kubernetes caps quantities at 2^63-1 in their integer form; so do we, so that
# a typo like "1e400" is rejected instead of turning into a huge number.
MAX_VALUE = 2**63 - 1
# No meaningful quantity is longer (2^63-1 is 19 digits; nano fractions add
# 10 more). Checked before any digit is converted: Python refuses int()
# of more than 4,300 digits with a ValueError, and big numbers cost time.
MAX_QUANTITY_LENGTH = 128


class QuantityError(ValueError):
    """A malformed or out-of-range quantity; the message names the value."""


def parse_exact(value: str | int | float, *, field: str = "quantity") -> Fraction:
    """Parse a Kubernetes quantity into an exact rational number of units."""
    if isinstance(value, bool):
        raise QuantityError(f"{field}: {value!r} is not a quantity")
    if isinstance(value, int):
        if value.bit_length() > 64:
            # Not printed: repr() of a huge int is slow or refused.
            raise QuantityError(f"{field}: integer is out of range")
        return Fraction(value)
    if isinstance(value, float):
        # JSON/YAML numbers: take the shortest decimal spelling, never binary noise.
        return parse_exact(repr(value), field=field)
    if not isinstance(value, str):
        # Named by type only: repr() of a deeply nested value recurses.
        raise QuantityError(f"{field}: a {type(value).__name__} is not a quantity")
    if len(value) > MAX_QUANTITY_LENGTH:
        raise QuantityError(f"{field}: {value[:20]!r}... ({len(value)} characters) is not a "
                            f"valid quantity (at most {MAX_QUANTITY_LENGTH} characters)")
    text = value.strip()
    match = _QUANTITY_RE.match(text)
    if match is None or text != value:
        raise QuantityError(
            f"{field}: {value!r} is not a valid quantity "
            "(expected e.g. 100m, 1.5, 2Gi, 1e3)"
        )
    number = Fraction(match["number"].removesuffix("."))
    if match["binary"]:
        number *= _BINARY_SUFFIXES[match["binary"]]
    else:
        exponent_text = match["exponent"]
        exponent = (
            int(exponent_text) if exponent_text is not None
            else _DECIMAL_EXPONENTS[match["decimal"] or ""]
        )
        if exponent > 64:
            if number != 0:
                raise QuantityError(f"{field}: {value!r} is out of range")
        elif exponent < -64 - len(match["number"]):
            # Far below any unit (the number has fewer digits than that): like
            # Kubernetes, keep it as a tiny positive amount, which rounds up
            # to one unit, without computing 10**-huge.
            number = Fraction(1, 10**70) if number != 0 else Fraction(0)
        else:
            number *= Fraction(10) ** exponent
    if match["sign"] == "-":
        number = -number
    return number


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


def parse_quantity(
    resource: str,
    value: str | int | float,
    *,
    field: str | None = None,
    allow_negative: bool = False,
) -> int:
    """Parse `value` for `resource` into integer units (millicores for cpu).

    `field` names the place in the user's object for error messages; it
    defaults to the resource name.
    """
    where = field or resource
    exact = parse_exact(value, field=where)
    if exact < 0 and not allow_negative:
        raise QuantityError(f"{where}: {value!r} must not be negative")
    if resource in MILLI_RESOURCES:
        exact *= 1000
    result = _ceil(exact)
    if abs(result) > MAX_VALUE:
        raise QuantityError(f"{where}: {value!r} is out of range")
    return result


def _prefers_binary(resource: str) -> bool:
    return resource.startswith(_BINARY_PREFERRED_PREFIXES)


def _format_decimal(units: int, exponent_floor: int) -> str:
    """Largest decimal SI suffix (at or above `exponent_floor`) that keeps an integer."""
    sign = "-" if units < 0 else ""
    magnitude = abs(units)
    if magnitude == 0:
        return "0"
    exponent = exponent_floor
    while exponent < 18 and magnitude % 1000 == 0:
        magnitude //= 1000
        exponent += 3
    suffix = next(s for s, e in _DECIMAL_EXPONENTS.items() if e == exponent)
    return f"{sign}{magnitude}{suffix}"


def format_quantity(resource: str, units: int) -> str:
    """Canonical Kubernetes spelling of an integer amount of `resource`.

    cpu: "3" or "1500m"; memory-like: the largest binary suffix that divides
    exactly ("12Gi"), else decimal; other resources: decimal SI ("2", "1k").
    """
    if resource in MILLI_RESOURCES:
        return _format_decimal(units, -3)
    if _prefers_binary(resource) and units != 0:
        magnitude = abs(units)
        best = ""
        best_value = magnitude
        for suffix, factor in _BINARY_SUFFIXES.items():
            if magnitude % factor == 0:
                best, best_value = suffix, magnitude // factor
        if best:
            return f"{'-' if units < 0 else ''}{best_value}{best}"
    return _format_decimal(units, 0)
