"""Wiring the admission loop into the server (a BACKGROUND_TASKS entry).

Every replica runs `run_admission`: it waits for the first full cache sync,
then campaigns for the Lease; only while it leads does an
`AdmissionController` run (a fresh one each time it becomes leader, which
rebuilds everything from the cache). With `leader_elect` off it just leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from arbiter import metrics
from arbiter.config import ServeConfig
from arbiter.kubeapi import KubeApi
from arbiter.loop.controller import AdmissionController, LoopSettings
from arbiter.loop.events import EventRecorder
from arbiter.loop.leader import LeaderElector, LeaseTiming

if TYPE_CHECKING:
    from arbiter.server import ServerContext

log = logging.getLogger(__name__)

# The controller of each running server (by id of its context), for the debug API.
_ACTIVE: dict[int, AdmissionController] = {}

# Other leader-only work, run beside the admission controller while this
# replica leads and cancelled when it stops: "module:function" names of
# `async (ctx) -> None`, imported when leadership starts.
LEADER_TASKS: tuple[str, ...] = (
    "arbiter.jobflow.controller:run_leader",
)


def _leader_task(entry: str) -> Callable[[ServerContext], Awaitable[None]]:
    module_name, _, attribute = entry.partition(":")
    task: Callable[[ServerContext], Awaitable[None]] = getattr(
        importlib.import_module(module_name), attribute)
    return task


def active_controller(ctx: ServerContext) -> AdmissionController | None:
    return _ACTIVE.get(id(ctx))


def settings_from(config: ServeConfig) -> LoopSettings:
    return LoopSettings(
        overcommit=config.overcommit,
        admission_timeout=config.admission_timeout,
        backoff_base=config.backoff_base,
        backoff_max=config.backoff_max,
        status_interval=config.status_interval,
        status_qps=config.status_qps,
        max_writes=config.loop_concurrency,
        reclaim_grace=config.reclaim_grace,
    )


def identity_of(config: ServeConfig) -> str:
    """Unique per process (two replicas on one host must differ), readable."""
    base = config.identity or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


async def wait_synced(ctx: ServerContext, poll: float = 0.1) -> None:
    """Until the first full LIST of every kind is in the cache (once, at start)."""
    while True:
        if ctx.store.synced:
            return
        await asyncio.sleep(poll)


async def run_admission(ctx: ServerContext) -> None:
    """The admission loop's background task."""
    if ctx.api is None:
        return
    config = ctx.config
    api = KubeApi(ctx.api)
    identity = identity_of(config)
    metrics.leader.set(0)
    await wait_synced(ctx)
    recorder = EventRecorder(api, instance=identity, qps=config.event_qps)
    sender = asyncio.get_running_loop().create_task(recorder.run())

    async def lead() -> None:
        controller = AdmissionController(ctx.store, api, settings_from(config),
                                         events=recorder, identity=identity)
        _ACTIVE[id(ctx)] = controller
        log.info("admission loop started", extra={"identity": identity})
        others = [asyncio.ensure_future(_leader_task(entry)(ctx)) for entry in LEADER_TASKS]
        try:
            await controller.run()
        finally:
            for other in others:
                other.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            _ACTIVE.pop(id(ctx), None)
            log.info("admission loop stopped", extra={"identity": identity})

    try:
        if config.leader_elect:
            timing = LeaseTiming(config.lease_duration, config.lease_renew_deadline,
                                 config.lease_retry_period)
            elector = LeaderElector(api, config.namespace, config.lease_name, identity, timing)
            await elector.run(lead)
        else:
            metrics.leader.set(1)
            await lead()
    finally:
        metrics.leader.set(0)
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
