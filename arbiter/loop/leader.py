"""Leader election on a coordination.k8s.io/v1 Lease.

The protocol client-go's leaderelection uses: a candidate takes the Lease
when it is free (no holder) or when its record has not changed for
`leaseDurationSeconds` *as observed locally* (never comparing clocks with
the holder); the holder renews every `retry_period` and gives up leading
when it could not renew for `renew_deadline` (shorter than the lease, so it
has stopped before anyone else may take over). Every write is an update
under the Lease's resourceVersion, so two candidates never both win. On a
clean shutdown the holder releases the Lease (empty holder, 1 s duration)
so a standby takes over at once.

A renewal is one update of the Lease we last wrote (a GET only when that
update conflicts), and it may take until the renew deadline, as in
client-go: on a loaded apiserver, or with this process's event loop busy,
a round trip can take seconds, and cutting each attempt short makes a
healthy leader give its Lease up. The deadline counts from when the last
successful renewal was *sent*: its renewTime is what others time the
Lease from.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from arbiter.base import metrics
from arbiter.base.aio import stop
from arbiter.base.kubeapi import AlreadyExists, ApiError, ClusterApi, Conflict, NotFound, lease_path

log = logging.getLogger(__name__)


def micro_time(when: float) -> str:
    """A MicroTime (RFC 3339 with microseconds), as Lease fields want it."""
    return dt.datetime.fromtimestamp(when, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs retry_period < renew_deadline < lease_duration")


class LeaderElector:
    def __init__(
        self,
        api: ClusterApi,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing or LeaseTiming()
        self.clock = clock
        self.wall = wall
        self.leading = False
        self.transitions = 0
        # What we last saw of the Lease and when (our clock), for expiry.
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0
        self._holding = False
        self._written: dict[str, Any] | None = None  # the Lease as our last write left it

    @property
    def path(self) -> str:
        return lease_path(self.namespace, self.name)

    def _spec(self, acquire: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.timing.lease_duration)),
            "acquireTime": acquire,
            "renewTime": micro_time(self.wall()),
            "leaseTransitions": transitions,
        }

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when we hold the Lease afterwards."""
        now = self.clock()
        if self._holding and self._written is not None and await self._renew_written(now):
            return True
        try:
            lease = await self.api.get(self.path)
        except NotFound:
            spec = self._spec(micro_time(self.wall()), 0)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            try:
                created = await self.api.create(lease_path(self.namespace), body)
            except (AlreadyExists, Conflict):
                return False
            self._wrote(created, now)
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        renewed = str(spec.get("renewTime") or "")
        if self._observed != (holder, renewed):
            self._observed = (holder, renewed)
            self._observed_at = now
        duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration)
        if holder and holder != self.identity and now < self._observed_at + duration:
            return False  # held by someone else, and alive as far as we can tell
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder != self.identity:
            transitions += 1
        acquire = (str(spec.get("acquireTime") or "") if holder == self.identity
                   else micro_time(self.wall())) or micro_time(self.wall())
        if not await self._update(lease, acquire, transitions, now):
            return False
        self.transitions = transitions
        return True

    async def _renew_written(self, now: float) -> bool:
        """Renew by updating the Lease we last wrote: one round trip. False
        when it changed since (someone else wrote it): the caller reads it."""
        assert self._written is not None
        spec = self._written.get("spec") or {}
        return await self._update(self._written, str(spec.get("acquireTime") or ""),
                                  int(spec.get("leaseTransitions") or 0), now)

    async def _update(self, lease: dict[str, Any], acquire: str, transitions: int,
                      now: float) -> bool:
        """Write `lease` back as ours, under its resourceVersion; False when
        it changed since."""
        updated = dict(lease)
        updated["spec"] = {**(lease.get("spec") or {}), **self._spec(acquire, transitions)}
        try:
            result = await self.api.replace(self.path, updated)
        except (Conflict, NotFound):
            self._written = None
            return False
        self._wrote(result, now)
        return True

    def _wrote(self, result: dict[str, Any], now: float) -> None:
        self._written = result
        new_spec = result.get("spec") or {}
        self._observed = (self.identity, str(new_spec.get("renewTime") or ""))
        self._observed_at = now

    async def _attempt(self, within: float) -> bool:
        try:
            async with asyncio.timeout(within):
                return await self.try_acquire_or_renew()
        except TimeoutError:
            log.warning("lease %s/%s: no answer within %.1fs", self.namespace, self.name, within)
            return False
        except (ApiError, OSError) as error:
            log.warning("lease %s/%s: %s", self.namespace, self.name, error)
            return False

    async def acquire(self) -> None:
        """Wait until we hold the Lease."""
        while True:
            sent = self.clock()
            if await self._attempt(self.timing.retry_period * 2):
                break
            await asyncio.sleep(self.timing.retry_period)
        self._last_renew = sent
        self._holding = True

    async def hold(self) -> None:
        """Renew until a renewal has failed for `renew_deadline`; then return."""
        while True:
            await asyncio.sleep(self.timing.retry_period)
            sent = self.clock()
            left = self._last_renew + self.timing.renew_deadline - sent
            if left > 0 and await self._attempt(left):
                self._last_renew = sent
            elif self.clock() - self._last_renew >= self.timing.renew_deadline:
                log.warning("lease %s/%s: could not renew for %.0fs; no longer leading",
                            self.namespace, self.name, self.timing.renew_deadline)
                self._holding = False
                return

    async def release(self) -> None:
        """Give the Lease up (best effort), so a standby need not wait it out."""
        try:
            lease = await self.api.get(self.path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            now = micro_time(self.wall())
            lease["spec"] = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1,
                             "acquireTime": now, "renewTime": now}
            await self.api.replace(self.path, lease)
        except ApiError as error:
            log.info("lease %s/%s not released: %s", self.namespace, self.name, error)

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Forever: acquire, run `lead()` while holding, stop it when lost.

        Cancelling `run` stops `lead()` first, then releases the Lease.
        """
        try:
            while True:
                await self.acquire()
                self.leading = True
                metrics.leader.set(1)
                log.info("lease %s/%s acquired by %s", self.namespace, self.name, self.identity)
                work = asyncio.ensure_future(lead())
                keeper = asyncio.ensure_future(self.hold())
                try:
                    done, _ = await asyncio.wait({work, keeper},
                                                 return_when=asyncio.FIRST_COMPLETED)
                finally:
                    # Until both have ended: a leader's work must not run on
                    # beside the next leader's (`arbiter.base.aio`).
                    for task in (work, keeper):
                        await stop(task)
                    self.leading = False
                    metrics.leader.set(0)
                if work in done and work.exception() is not None:
                    log.error("leader work failed: %r; giving the lease up", work.exception())
                    await self.release()
                    await asyncio.sleep(self.timing.retry_period)
        finally:
            if self._holding:
                self._holding = False
                await self.release()
