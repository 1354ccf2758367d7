"""The loop's own check of who may use a queue (DESIGN §13).

The webhook denies work naming a queue that does not admit its namespace,
but a unit can still name one: a reservation created while the Queue still
admitted its namespace, then the Queue changed; a Job labelled while the
webhook was bypassed. Such a unit (*barred*) is never admitted nor charged
to that queue: it stays out of the engine, a Job of it that runs is
suspended again, and it waits `Enqueued` with a message saying why. Units
in unmanaged namespaces are not looked at at all (`AdmissionController`),
whatever their status says. The rule itself is `ClusterStore.queue_admits`,
the one the webhook applies.
"""

from __future__ import annotations

from arbiter.cache.ownership import WORKLOAD_CONSUMERS
from arbiter.cache.records import UnitRecord
from arbiter.cache.store import ClusterStore
from arbiter.loop.consumers import Consumer
from arbiter.loop.units import Step, held


def barred(store: ClusterStore, unit: UnitRecord) -> str | None:
    """Why `unit` may not use its queue, or None when it may. A queue that
    does not exist is not this rule's business (the unit waits, parked)."""
    if unit.queue not in store.queues or store.queue_admits(unit.queue, unit.namespace):
        return None
    return (f'queue "{unit.queue}" does not admit namespace "{unit.namespace}" (neither its '
            "spec.namespaces nor its spec.namespaceSelector): the unit waits until it does")


def barred_step(unit: UnitRecord, consumer: Consumer, message: str) -> Step | None:
    """What a barred unit needs: its running Job (workload) held again, then the
    unit back to `Enqueued` with `message`. None when the unit's consumer is
    gone or finished: that is decided as for any unit."""
    consumer = held(unit, consumer)
    if consumer in (Consumer.MISSING, Consumer.SUCCEEDED, Consumer.FAILED) \
            or unit.phase in ("Succeed", "Failed"):
        return None
    # A Job or an integration's workload is held again (suspended, or its
    # pods made again gated); a plain pod's gate cannot come back.
    holdable = unit.consumer is not None and (
        unit.consumer.kind == "Job" or unit.consumer.kind in WORKLOAD_CONSUMERS)
    if holdable and consumer in (Consumer.RELEASED, Consumer.RUNNING):
        return Step("hold")
    if unit.phase != "Enqueued" or unit.message != message:
        return Step("phase", "Enqueued", message)
    return Step("none")
