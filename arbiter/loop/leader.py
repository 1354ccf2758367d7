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
                await self.api.create(lease_path(self.namespace), body)
            except (AlreadyExists, Conflict):
                return False
            self._observed = (self.identity, str(spec["renewTime"]))
            self._observed_at = now
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
        updated = dict(lease)
        updated["spec"] = {**spec, **self._spec(acquire, transitions)}
        try:
            result = await self.api.replace(self.path, updated)
        except (Conflict, NotFound):
            return False
        new_spec = result.get("spec") or {}
        self._observed = (self.identity, str(new_spec.get("renewTime") or ""))
        self._observed_at = now
        self.transitions = transitions
        return True

    async def _attempt(self) -> bool:
        try:
            async with asyncio.timeout(self.timing.retry_period * 2):
                return await self.try_acquire_or_renew()
        except (ApiError, OSError, TimeoutError) as error:
            log.warning("lease %s/%s: %s", self.namespace, self.name, error)
            return False

    async def acquire(self) -> None:
        """Wait until we hold the Lease."""
        while True:
            if await self._attempt():
                break
            await asyncio.sleep(self.timing.retry_period)
        self._last_renew = self.clock()
        self._holding = True

    async def hold(self) -> None:
        """Renew until a renewal has failed for `renew_deadline`; then return."""
        while True:
            await asyncio.sleep(self.timing.retry_period)
            if await self._attempt():
                self._last_renew = self.clock()
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
