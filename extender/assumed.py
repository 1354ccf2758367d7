"""Pods the extender approved that the cache has not yet seen bound.

Between filter saying yes and the pod's binding reaching arbiter's watch,
the pod uses its queue's capacity without appearing on a node. Counting
these "assumed" pods keeps two pods of a queue, filtered a millisecond
apart, from both squeezing through the last slot under `capability`.

An entry ends when the cache sees the pod bound or deleted, or after a TTL:
approval is not placement (another plugin, the bind call or a later
extender may still fail the pod), and a stale entry must not block its
queue forever. Same idea as kube-scheduler's own assumed-pod cache.

Expired entries are dropped on every insert as well as on every read, so
approvals for queues nobody reads (no capability) go too; and the table
holds at most `max_entries`, dropping the oldest first, so a flood of
approvals costs bounded memory.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from arbiter.core.resources import EMPTY, Resources

# Entries at most: ~30 s of approvals at over 1,000 pods/s.
MAX_ENTRIES = 50_000


@dataclass(frozen=True, slots=True)
class AssumedPod:
    uid: str
    queue: str
    requests: Resources
    expires: float


class AssumedPods:
    """uid -> AssumedPod, with a running per-queue sum; O(1) per operation.

    Entries are kept in expiry order (every entry gets the same TTL and a
    renewed entry moves to the end), so expiring is popping from the front.
    """

    def __init__(self, ttl: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 *, max_entries: int = MAX_ENTRIES) -> None:
        if ttl <= 0:
            raise ValueError(f"assume TTL must be positive, got {ttl}")
        if max_entries < 1:
            raise ValueError(f"the assumed-pod bound must be positive, got {max_entries}")
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, AssumedPod] = OrderedDict()
        self._by_queue: dict[str, Resources] = {}

    @property
    def stored(self) -> int:
        """Entries held now, expired or not."""
        return len(self._entries)

    def __len__(self) -> int:
        self.expire()
        return len(self._entries)

    def __contains__(self, uid: object) -> bool:
        self.expire()
        return uid in self._entries

    def assume(self, uid: str, queue: str, requests: Resources) -> None:
        """Record (or renew) an approval; expired entries go first, and the
        oldest beyond the bound (each insert pops at most what it adds, plus
        what expired: amortised O(1))."""
        self.forget(uid)
        self.expire()
        while len(self._entries) >= self.max_entries:
            self.forget(next(iter(self._entries)))
        entry = AssumedPod(uid, queue, requests, self._clock() + self.ttl)
        self._entries[uid] = entry
        self._by_queue[queue] = self._by_queue.get(queue, EMPTY) + requests

    def forget(self, uid: str) -> None:
        entry = self._entries.pop(uid, None)
        if entry is None:
            return
        remaining = self._by_queue.get(entry.queue, EMPTY) - entry.requests
        if remaining.is_zero():
            # A zero sum reads the same as an absent one; dropping it keeps the
            # table from growing with every queue ever seen.
            self._by_queue.pop(entry.queue, None)
        else:
            self._by_queue[entry.queue] = remaining

    def expire(self) -> None:
        now = self._clock()
        while self._entries:
            uid, entry = next(iter(self._entries.items()))
            if entry.expires > now:
                break
            self.forget(uid)

    def usage(self, queue: str, *, excluding: str | None = None) -> Resources:
        """What `queue`'s assumed pods request, not counting pod `excluding`."""
        self.expire()
        total = self._by_queue.get(queue, EMPTY)
        if excluding is not None:
            entry = self._entries.get(excluding)
            if entry is not None and entry.queue == queue:
                total = total - entry.requests
        return total

    def get(self, uid: str) -> AssumedPod | None:
        self.expire()
        return self._entries.get(uid)
