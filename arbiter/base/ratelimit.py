"""Rate limits for what arbiter writes beside its real work: Queue status,
unit positions, Events. Not tied to any one of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class KeyedBuckets:
    """A `TokenBucket` per key (a client's address, say): one key spending
    its budget leaves the others theirs. Past `max_keys` the least recently
    used key is forgotten (it starts again with a full burst)."""

    def __init__(self, rate: float, burst: float, max_keys: int) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        # Insertion-ordered, re-inserted on use: the first is the least recent.
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, key: str, now: float) -> bool:
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.burst, now)
            while len(self._buckets) >= self.max_keys:
                del self._buckets[next(iter(self._buckets))]
        self._buckets[key] = bucket
        return bucket.take(now)


class Throttle:
    """Per-object: write only changed content, at most once per `interval`."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last: dict[str, tuple[Any, float]] = {}

    def due(self, key: str, content: Any, now: float) -> bool:
        last = self._last.get(key)
        if last is None:
            return True
        return last[0] != content and now - last[1] >= self.interval

    def written(self, key: str, content: Any, now: float) -> None:
        self._last[key] = (content, now)

    def forget(self, keep: Iterable[str]) -> None:
        keep = set(keep)
        for key in [k for k in self._last if k not in keep]:
            del self._last[key]
