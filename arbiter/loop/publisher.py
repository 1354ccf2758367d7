"""Status publishing beside the admission loop: metrics, Queue statuses,
unit positions and Waiting events, rendered from the engine each round.

It runs as its own task and shares only the engine (read) and the loop's
in-flight writes (a position write is a write like any other: it takes the
unit's key, and its result is assumed until the watch has it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping

from arbiter.base import metrics
from arbiter.base.kubeapi import ApiError
from arbiter.base.ratelimit import Throttle, TokenBucket
from arbiter.cache.records import UnitRecord
from arbiter.cache.store import ClusterStore
from arbiter.core.model import Unit
from arbiter.loop.actions import Actions
from arbiter.loop.events import EventSink
from arbiter.loop.inflight import InFlightWrites
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.pool_status import (
    PoolMetrics,
    PoolStatusWriter,
    PoolView,
    pool_views,
    queue_pools,
)
from arbiter.loop.status import QueueMetrics, QueueStatusWriter, QueueView, positions, queue_views

log = logging.getLogger(__name__)

# How the engine's explanations of node fit begin (AdmissionEngine._no_room):
# a unit that fits in total but on no node of its pools.
NODE_FIT_REASON = "no node"
# ... and of a unit that waits only for the next pass (nothing to say):
# the flat engine's and the tree's.
FITS_REASONS = ("fits now", "waiting for its turn")


class StatusPublisher:
    def __init__(
        self,
        store: ClusterStore,
        mirror: EngineMirror,
        actions: Actions,
        writes: InFlightWrites,
        *,
        unit: Callable[[str], UnitRecord | None],
        events: EventSink | None,
        clock: Callable[[], float],
        interval: float = 2.0,
        qps: float = 20.0,
        waiting_event_depth: int = 100,
        position_depth: int = 1000,
    ) -> None:
        """Each object is written at most once per `interval`, all together
        under `qps` a second; Waiting events and positions go to the first
        units of each queue only (`LoopSettings` says why)."""
        self.store = store
        self.mirror = mirror
        self.actions = actions
        self.writes = writes
        self.unit = unit
        self.events = events
        self.clock = clock
        self.interval = interval
        self.waiting_event_depth = waiting_event_depth
        self.position_depth = position_depth
        self.views: dict[str, QueueView] = {}
        self.pool_views: dict[str, PoolView] = {}
        self.queue_metrics = QueueMetrics()
        self.pool_metrics = PoolMetrics()
        self.queue_writer = QueueStatusWriter(actions.api, interval=interval)
        self.pool_writer = PoolStatusWriter(actions.api, interval=interval)
        self._unplaceable: set[str] = set()  # units counted in unit_unplaceable_total
        self.position_throttle = Throttle(interval)
        self.status_bucket = TokenBucket(qps, max(1.0, qps * 2), clock())
        self._waiting_said: dict[str, str] = {}
        # Why waiting units are not reclaiming (set by the controller to the
        # reclaimer's `notes`): shown as their message.
        self.reclaim_notes: Callable[[], Mapping[str, str]] = dict

    async def publish(self) -> None:
        """One status round: metrics, Queue statuses, positions, Waiting events."""
        now = self.clock()
        self.writes.expire_overrides(now)
        waiting = self.mirror.waiting_by_queue()
        shares = {queue: tuple(share.to_json() for share in held)
                  for queue, held in queue_pools(self.mirror).items()}
        views = queue_views(self.mirror, waiting=waiting, pools=shares)
        self.views = views
        self.queue_metrics.update(views)
        for view in self.queue_writer.due(views, now):
            # One write per Queue at a time: under a slow apiserver a round
            # outlived the interval, the next spawned the same Queue's
            # write again and the two conflicted (GET, PATCH again), the
            # load that made the apiserver slow (measured: 2.6 Queue status
            # PATCHes and 1.1 GETs per admitted Job, 20 queues).
            key = f"queue-status:{view.name}"
            if self.writes.busy(key):
                continue
            if not self.status_bucket.take(now):
                break
            self.writes.spawn(functools.partial(self._write_queue, view, now), key=key,
                              queued=False)
        self._publish_pools(now)
        depth = self.position_depth
        self._publish_positions(positions(self.mirror, waiting=waiting, depth=depth),
                                self._head_messages(views, waiting), now)
        self._waiting_events(views, waiting)

    def _publish_pools(self, now: float) -> None:
        self.pool_views = pool_views(self.mirror)
        self.pool_metrics.update(self.pool_views)
        for view in self.pool_writer.due(self.pool_views, self.store.pools, now):
            key = f"pool-status:{view.name}"  # one at a time, as for Queues
            if self.writes.busy(key):
                continue
            if not self.status_bucket.take(now):
                break
            self.writes.spawn(functools.partial(self._write_pool, view, now), key=key,
                              queued=False)

    async def _write_pool(self, view: PoolView, now: float) -> None:
        try:
            await self.pool_writer.write(view, now)
        except ApiError as error:
            log.warning("status of Pool %s not written: %s", view.name, error)

    def _head_messages(self, views: dict[str, QueueView],
                       waiting: dict[str, list[Unit]]) -> dict[str, str]:
        """The message of each queue's head unit that cannot be admitted now:
        the engine's explanation (`QueueView.reason`, the reason the debug
        API and the web view show for it: capability, cluster full, room on
        a node naming the largest free slot, ...), or the reclaimer's note
        on why it is not reclaiming, more telling than "cluster full" (but
        not than node fit). Units behind the head get none: explaining
        every waiting unit each round costs a node fit each. A unit waiting
        for room on a node is counted once in `arbiter_unit_unplaceable_total`."""
        out: dict[str, str] = {}
        node_fit: set[str] = set()
        for name, units in waiting.items():
            view = views.get(name)
            if not units or view is None or not view.reason \
                    or view.reason.startswith(FITS_REASONS):
                continue
            head = units[0].key
            out[head] = f"waiting in queue {name}: {view.reason}"
            if view.reason.startswith(NODE_FIT_REASON):
                node_fit.add(head)
                if head not in self._unplaceable:
                    self._unplaceable.add(head)
                    metrics.unit_unplaceable_total.labels(name).inc()
        if self._unplaceable:
            still = {unit.key for units in waiting.values() for unit in units}
            self._unplaceable &= still
        for key, note in self.reclaim_notes().items():
            entry = self.mirror.entries.get(key)
            if entry is not None and entry[0] == "pending" and key not in node_fit:
                out[key] = f"waiting in queue {entry[1].queue}: {note}"
        return out

    def _publish_positions(self, where: dict[str, int], messages: dict[str, str],
                           now: float) -> None:
        def order(item: tuple[str, int]) -> tuple[bool, int]:
            # A unit with no position yet first: its first status beats a
            # shift of one already shown. Every admission shifts them all,
            # and by position alone those shifts took the whole write
            # budget: units deep in a busy queue had no status for minutes.
            unit = self.unit(item[0])
            return unit is not None and unit.position is not None, item[1]

        for key, position in sorted(where.items(), key=order):
            if self.writes.busy(key):
                continue
            unit = self.unit(key)
            message = messages.get(key)
            if unit is None or (unit.position == position
                                and message in (None, unit.message)):
                continue
            if not self.position_throttle.due(key, (position, message), now):
                continue
            if not self.status_bucket.take(now):
                break
            self.writes.spawn(functools.partial(self._write_position, unit, position, message),
                              key=key)
        self.position_throttle.forget(where)

    async def _write_position(self, unit: UnitRecord, position: int,
                              message: str | None = None) -> None:
        key = unit.key
        try:
            async with self.writes.locked(key):
                written = await self.actions.write_position(unit, position, message)
            if written is not None:
                self.writes.assume(written.record)
            self.position_throttle.written(key, (position, message), self.clock())
        except ApiError as error:
            log.debug("position of %s not written: %s", key, error)

    async def _write_queue(self, view: QueueView, now: float) -> None:
        try:
            await self.queue_writer.write(view, self.store.queues.get(view.name), now)
        except ApiError as error:
            log.warning("status of Queue %s not written: %s", view.name, error)

    def _waiting_events(self, views: dict[str, QueueView], waiting: dict[str, list[Unit]]) -> None:
        if self.events is None:
            return
        depth = self.waiting_event_depth
        for name, units in waiting.items():
            reason = views[name].reason if name in views else ""
            for index, unit in enumerate(units[:depth]):
                category = f"head:{reason}" if index == 0 else "behind"
                if self._waiting_said.get(unit.key) == category:
                    continue
                record = self.unit(unit.key)
                if record is None:
                    continue
                self._waiting_said[unit.key] = category
                message = (f"waiting in queue {name}: {reason}" if index == 0
                           else f"waiting in queue {name}: behind {index} units")
                self.events.unit_event(record, "Normal", "Waiting", message, on_unit=False)
        if self._waiting_said:
            still = {unit.key for units in waiting.values()
                     for unit in units[: self.position_depth]}
            for key in [k for k in self._waiting_said if k not in still]:
                del self._waiting_said[key]

    async def run(self) -> None:
        """Publish status every half interval (each object is throttled itself)."""
        while True:
            try:
                await self.publish()
            except Exception:
                log.exception("status round failed")
            await asyncio.sleep(max(0.05, self.interval / 2))
