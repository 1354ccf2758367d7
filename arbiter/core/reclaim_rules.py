"""The move rule's building blocks (`arbiter.core.reclaim`), exact: amounts
are integers, shares compared by cross-multiplying. Pure: no I/O. Apart so
that the tree's rule (`arbiter.core.reclaim_tree`) uses the same ones."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from arbiter.core.fairshare import dominant_share_of

__all__ = ["stays_richer", "under_guarantee", "weighted_share", "within_capability"]


def under_guarantee(allocated: Mapping[str, int], demand: Mapping[str, int],
                    guarantee: Mapping[str, int]) -> bool:
    """allocated + demand <= guarantee on every resource `demand` requests
    (admission's "under guarantee"; a unit requesting nothing is not)."""
    requested = [(r, v) for r, v in demand.items() if v > 0]
    return bool(requested) and all(allocated.get(r, 0) + v <= guarantee.get(r, 0)
                                   for r, v in requested)


def weighted_share(allocated: Mapping[str, int], capacity: Mapping[str, int],
                   weight: int) -> Fraction:
    """Weighted dominant share: max over r of allocated[r] / (capacity[r] * weight)."""
    return dominant_share_of(allocated, capacity) / weight


def stays_richer(left: Mapping[str, int], capacity: Mapping[str, int], weight: int,
                 share: Fraction) -> bool:
    """weighted_share(left) > share, exactly: some resource r with capacity has
    left[r] * share.den > share.num * capacity[r] * weight."""
    num, den = share.numerator, share.denominator
    return any(v * den > num * capacity.get(r, 0) * weight
               for r, v in left.items() if v > 0 and capacity.get(r, 0) > 0)


def within_capability(allocated: Mapping[str, int], demand: Mapping[str, int],
                      capability: Mapping[str, int]) -> bool:
    """allocated + demand <= capability on every requested, capped resource."""
    return all(allocated.get(r, 0) + v <= capability[r]
               for r, v in demand.items() if v > 0 and r in capability)
