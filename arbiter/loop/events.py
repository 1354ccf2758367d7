"""Kubernetes Events (core/v1) about units: Admitted, Waiting, Backoff.

Events are best effort and must never slow admission down: `emit` only
queues (a bounded queue: the oldest are dropped when it overflows), a
background sender posts them at a limited rate, an event identical to one
sent in the last ten minutes is not sent again, and one that waited longer
than `max_age` behind a burst is dropped (news that late misleads more than
it helps).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from arbiter.base.kubeapi import ApiError, ClusterApi, events_path
from arbiter.base.ratelimit import TokenBucket
from arbiter.cache.records import UnitRecord
from arbiter.core.api import API_VERSION, QUEUE_UNIT, format_rfc3339
from arbiter.integrations import BY_KIND

log = logging.getLogger(__name__)

COMPONENT = "kube-arbiter"
DEDUP_SECONDS = 600.0
MAX_MESSAGE = 1024
MAX_AGE = 60.0



class EventSink(Protocol):
    """Where the loop reports what happened to a unit (`EventRecorder` here)."""

    def unit_event(self, unit: UnitRecord, type_: str, reason: str, message: str,
                   *, on_unit: bool = True) -> None: ...


@dataclass(frozen=True, slots=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""


def unit_ref(unit: UnitRecord) -> ObjectRef:
    return ObjectRef(API_VERSION, QUEUE_UNIT.kind, unit.namespace, unit.name, unit.uid)


def consumer_ref(unit: UnitRecord) -> ObjectRef | None:
    consumer = unit.consumer
    if consumer is None:
        return None
    integration = BY_KIND.get(consumer.kind)
    if integration is None:
        return None  # a pod group: no one object to put the Event on
    return ObjectRef(integration.api_version, integration.kind, unit.namespace,
                     consumer.name, consumer.uid)


def event_object(ref: ObjectRef, type_: str, reason: str, message: str, now: float,
                 instance: str) -> dict[str, Any]:
    stamp = format_rfc3339(now)
    suffix = f"{time.time_ns():x}"
    involved = {"apiVersion": ref.api_version, "kind": ref.kind,
                "namespace": ref.namespace, "name": ref.name}
    if ref.uid:
        involved["uid"] = ref.uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ref.name[: 253 - len(suffix) - 1]}.{suffix}",
                     "namespace": ref.namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": type_,
        "source": {"component": COMPONENT, **({"host": instance} if instance else {})},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventRecorder:
    def __init__(
        self,
        api: ClusterApi,
        *,
        instance: str = "",
        qps: float = 20.0,
        burst: int = 50,
        max_queue: int = 5000,
        max_age: float = MAX_AGE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.instance = instance or os.uname().nodename
        self.clock = clock
        self.bucket = TokenBucket(qps, burst, clock())
        self.max_age = max_age
        # (queued at, event)
        self._queue: collections.deque[tuple[float, dict[str, Any]]] = collections.deque(
            maxlen=max_queue)
        self._recent: collections.OrderedDict[tuple[str, str, str, str], float] = (
            collections.OrderedDict())
        self._ready = asyncio.Event()
        self.sent = 0
        self.dropped = 0

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        now = self.clock()
        ident = (ref.namespace, ref.uid or f"{ref.kind}/{ref.name}", reason, message)
        last = self._recent.get(ident)
        if last is not None and now - last < DEDUP_SECONDS:
            return
        self._recent[ident] = now
        self._recent.move_to_end(ident)
        while len(self._recent) > 20000:
            self._recent.popitem(last=False)
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append((now, event_object(ref, type_, reason, message, now, self.instance)))
        self._ready.set()

    def unit_event(self, unit: UnitRecord, type_: str, reason: str, message: str,
                   *, on_unit: bool = True) -> None:
        """On the unit and on its Job or pod (`on_unit=False`: the consumer
        only, when it has one)."""
        consumer = consumer_ref(unit)
        if consumer is not None:
            self.emit(consumer, type_, reason, message)
        if on_unit or consumer is None:
            self.emit(unit_ref(unit), type_, reason, message)

    def pending(self) -> int:
        return len(self._queue)

    async def flush(self) -> None:
        """Send everything queued now, ignoring the rate (tests, shutdown)."""
        while self._queue:
            await self._send(self._queue.popleft()[1])

    def _next(self) -> dict[str, Any] | None:
        """The oldest event still worth sending (older ones are dropped)."""
        now = self.clock()
        while self._queue:
            queued, event = self._queue.popleft()
            if now - queued <= self.max_age:
                return event
            self.dropped += 1
        return None

    async def _send(self, event: dict[str, Any]) -> None:
        try:
            await self.api.create(events_path(event["metadata"]["namespace"]), event)
            self.sent += 1
        except ApiError as error:
            log.debug("event %s not recorded: %s", event["reason"], error)

    async def run(self) -> None:
        """The sender: forever, at the configured rate."""
        while True:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            if not self.bucket.take(self.clock()):
                await asyncio.sleep(1.0 / max(self.bucket.rate, 0.001))
                continue
            event = self._next()
            if event is not None:
                await self._send(event)
