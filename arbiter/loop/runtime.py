"""Running the admission loop under leader election (a background task
that `arbiter.server.app` starts with every dependency passed by keyword).

Every replica runs `run_admission`: it waits for the first full cache sync,
then campaigns for the Lease; only while it leads does an
`AdmissionController` run (a fresh one each time it becomes leader), with
the other leader-only tasks beside it. Meanwhile a standby keeps an engine
warm (`arbiter.loop.standby`) that the new controller starts from, so it
admits at once; a replica that stops leading drops its controller's engine
and warms a fresh one. Without an election it just leads.

This module knows nothing of the server: what it needs comes in as
arguments, and what others read (the running controller, for the debug
API) goes out through the `Leadership` holder they share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from arbiter.base import metrics
from arbiter.base.kubeapi import KubeApi
from arbiter.cache.store import ClusterStore
from arbiter.loop.controller import AdmissionController
from arbiter.loop.events import EventRecorder
from arbiter.loop.leader import LeaderElector, LeaseTiming
from arbiter.loop.settings import LoopSettings
from arbiter.loop.standby import WarmStandby

log = logging.getLogger(__name__)

# Leader-only work: started when this replica becomes leader, cancelled when it stops.
LeaderTask = Callable[[], Coroutine[Any, Any, None]]


@dataclass(slots=True)
class Leadership:
    """The admission controller this process runs while it leads (None
    otherwise). The debug API reads the leader's own numbers from it."""

    controller: AdmissionController | None = None


@dataclass(frozen=True, slots=True)
class Election:
    """The Lease replicas campaign for."""

    namespace: str
    lease_name: str
    timing: LeaseTiming


def identity_of(base: str) -> str:
    """Unique per process (two replicas on one host must differ), readable."""
    return f"{base or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


async def wait_synced(store: ClusterStore, poll: float = 0.1) -> None:
    """Until the first full LIST of every kind is in the cache (once, at start)."""
    while True:
        if store.synced:
            return
        await asyncio.sleep(poll)


async def run_admission(*, api: Any | None, store: ClusterStore, settings: LoopSettings,
                        election: Election | None, replica: str, event_qps: float,
                        leadership: Leadership,
                        leader_tasks: Mapping[str, LeaderTask],
                        lease_api: Any | None = None,
                        fast_path_key: bytes | None = None) -> None:
    """The admission loop's background task (returns at once without a
    cluster). `replica` names this process in the Lease and in Events
    (the host name when empty), made unique per run. `lease_api`: the
    client the Lease is renewed with (`api` when None)."""
    if api is None:
        return
    identity = identity_of(replica)
    kube = KubeApi(api)
    metrics.leader.set(0)
    await wait_synced(store)
    recorder = EventRecorder(kube, instance=identity, qps=event_qps)
    sender = asyncio.get_running_loop().create_task(recorder.run())

    standby: WarmStandby | None = None

    def stand_by() -> None:
        nonlocal standby
        if election is not None and settings.warm_standby:
            standby = WarmStandby(store, settings.overcommit)
            standby.start()

    async def lead() -> None:
        nonlocal standby
        follow = await standby.take() if standby is not None else None
        standby = None
        controller = AdmissionController(store, kube, settings, events=recorder,
                                         identity=identity, follow=follow,
                                         fast_path_key=fast_path_key)
        leadership.controller = controller
        log.info("admission loop started", extra={"identity": identity})
        others = [asyncio.create_task(task(), name=name) for name, task in leader_tasks.items()]
        try:
            await controller.run()
        finally:
            for other in others:
                other.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            leadership.controller = None
            log.info("admission loop stopped", extra={"identity": identity})
            stand_by()  # a fresh follower: the controller's holds its own writes' guesses

    stand_by()
    try:
        if election is not None:
            elector = LeaderElector(KubeApi(lease_api) if lease_api is not None else kube,
                                    election.namespace, election.lease_name, identity,
                                    election.timing)
            await elector.run(lead)
        else:
            metrics.leader.set(1)
            await lead()
    finally:
        metrics.leader.set(0)
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
