"""An immutable vector of resource amounts (integers, see quantities)."""

from __future__ import annotations

import re
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any

from arbiter.core.quantities import QuantityError, format_quantity, parse_quantity

# Resource names, as the apiserver validates a container's resources:
# a qualified name ([prefix/]name) that is either a standard container
# resource or, with a domain prefix, an extended resource.
STANDARD_CONTAINER_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
HUGEPAGES_PREFIX = "hugepages-"
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Quota names requests.<name> must stay qualified names (IsExtendedResourceName).
_REQUESTS_PREFIX = "requests."
RESOURCE_NAME_RULE = (
    "a standard resource (cpu, memory, ephemeral-storage, hugepages-<size>) or an extended "
    "resource with a domain prefix (example.com/foo)"
)


def _qualified_name_problem(name: str) -> str | None:
    prefix, slash, local = name.rpartition("/")
    if slash and (not prefix or "/" in prefix):
        return "a qualified name has at most one '/', after a non-empty DNS prefix"
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "its prefix must be a lowercase DNS subdomain (example.com)"
    if len(local) > 63 or not _QUALIFIED_NAME_PART.match(local):
        return ("its name part must be at most 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit")
    return None


def resource_name_problem(name: str) -> str | None:
    """Why `name` is not a valid container resource name, or None when it is
    (the apiserver's validateContainerResourceName)."""
    problem = _qualified_name_problem(name)
    if problem is not None:
        return problem
    if "/" not in name:
        if name in STANDARD_CONTAINER_RESOURCES or name.startswith(HUGEPAGES_PREFIX):
            return None
        return f"must be {RESOURCE_NAME_RULE}"
    if "kubernetes.io/" in name:
        return None  # a native resource
    if name.startswith(_REQUESTS_PREFIX) or _qualified_name_problem(_REQUESTS_PREFIX + name):
        return f"must be {RESOURCE_NAME_RULE}"
    return None


class Resources(Mapping[str, int]):
    """Resource name -> integer amount; zero entries are dropped.

    Except in limits built with `keep_zero=True` (a Queue's capability),
    where "cpu: 0" means "no cpu at all", not "unlimited"; arithmetic on
    them drops zeros as usual.

    Immutable and hashable, so it can be shared between the cache, the
    engine and snapshots without defensive copies.
    """

    __slots__ = ("_amounts", "_hash")

    _amounts: dict[str, int]
    _hash: int | None

    def __init__(
        self,
        amounts: Mapping[str, int] | Iterable[tuple[str, int]] = (),
        *,
        keep_zero: bool = False,
    ) -> None:
        items = amounts.items() if isinstance(amounts, Mapping) else amounts
        if keep_zero:
            self._amounts = dict(items)
        else:
            self._amounts = {name: value for name, value in items if value != 0}
        self._hash = None

    @classmethod
    def parse(
        cls,
        quantities: Mapping[str, Any] | None,
        *,
        field: str = "resources",
        keep_zero: bool = False,
    ) -> Resources:
        """Parse a Kubernetes ResourceList; errors name `field.<resource>`.

        `keep_zero` keeps explicit zero amounts (for limits, see the class)."""
        if quantities is None:
            return EMPTY
        if not isinstance(quantities, Mapping):
            raise QuantityError(f"{field}: expected a map of resource name to quantity")
        amounts: dict[str, int] = {}
        for name, value in quantities.items():
            if not isinstance(name, str) or not name:
                raise QuantityError(f"{field}: resource names must be non-empty strings")
            amounts[name] = parse_quantity(name, value, field=f"{field}.{name}")
        return cls(amounts, keep_zero=keep_zero)

    # Mapping protocol -------------------------------------------------------
    def __getitem__(self, name: str) -> int:
        return self._amounts[name]

    def get_amount(self, name: str) -> int:
        return self._amounts.get(name, 0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    # The Mapping mixins go through __getitem__ per key; delegate to the dict
    # instead (the engine converts 100,000s of these).
    def __contains__(self, name: object) -> bool:
        return name in self._amounts

    def keys(self) -> KeysView[str]:
        return self._amounts.keys()

    def values(self) -> ValuesView[int]:
        return self._amounts.values()

    def items(self) -> ItemsView[str, int]:
        return self._amounts.items()

    def names_amounts(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(names, amounts) as given: equal exactly for equal items in the same
        order; cheaper to build and hash than a tuple of (name, amount) pairs."""
        amounts = self._amounts
        return tuple(amounts), tuple(amounts.values())

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._amounts.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Resources):
            return self._amounts == other._amounts
        if isinstance(other, Mapping):
            return self._amounts == {k: v for k, v in other.items() if v != 0}
        return NotImplemented

    def __repr__(self) -> str:
        return f"Resources({self._amounts!r})"

    # Arithmetic -------------------------------------------------------------
    def __add__(self, other: Mapping[str, int]) -> Resources:
        if not other:
            return self
        amounts = dict(self._amounts)
        for name, value in other.items():
            amounts[name] = amounts.get(name, 0) + value
        return Resources(amounts)

    def __sub__(self, other: Mapping[str, int]) -> Resources:
        if not other:
            return self
        amounts = dict(self._amounts)
        for name, value in other.items():
            amounts[name] = amounts.get(name, 0) - value
        return Resources(amounts)

    def scale(self, factor: int) -> Resources:
        return Resources({name: value * factor for name, value in self._amounts.items()})

    def fits_in(self, limit: Mapping[str, int]) -> bool:
        """Every amount here is <= the same resource in `limit` (absent = 0)."""
        return all(value <= limit.get(name, 0) for name, value in self._amounts.items())

    def within_caps(self, caps: Mapping[str, int]) -> bool:
        """Like fits_in, but resources absent from `caps` are unlimited."""
        return all(value <= caps[name] for name, value in self._amounts.items() if name in caps)

    def clamp_min(self, floor: int = 0) -> Resources:
        return Resources({n: max(v, floor) for n, v in self._amounts.items()})

    def minimum(self, other: Mapping[str, int]) -> Resources:
        """Elementwise min over the union of names (absent = 0)."""
        names = set(self._amounts) | set(other)
        return Resources({n: min(self.get_amount(n), other.get(n, 0)) for n in names})

    def maximum(self, other: Mapping[str, int]) -> Resources:
        names = set(self._amounts) | set(other)
        return Resources({n: max(self.get_amount(n), other.get(n, 0)) for n in names})

    def is_zero(self) -> bool:
        return not self._amounts

    def has_negative(self) -> bool:
        return any(value < 0 for value in self._amounts.values())

    def to_quantities(self) -> dict[str, str]:
        """Canonical Kubernetes strings, names sorted (for stable JSON)."""
        return {name: format_quantity(name, self._amounts[name]) for name in sorted(self._amounts)}


EMPTY = Resources()
