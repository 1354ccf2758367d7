"""Deployment (`apps/v1`): refused without a queue; its pod template gets
the queue label, so each pod it creates is gated and queued as a unit of
its own. Per pod, not one unit of `replicas`: a Deployment's replicas are
independent (no gang to keep), a rolling update runs pods of two
ReplicaSets at once (a unit of `replicas` would either block the surge or
admit it uncharged), and an autoscaler adds and removes pods one at a time;
a pod unit follows each of them exactly. Reclaim evicts a pod, its
ReplicaSet makes a new one, and that waits in the queue again."""

from __future__ import annotations

from arbiter.integrations.base import Integration, Obj, UnitSpec


class Deployment(Integration):
    name = "deployment"
    group = "apps"
    version = "v1"
    resource = "deployments"
    kind = "Deployment"
    prefix = "deploy"
    hold = "gate"
    children = ("ReplicaSet", "Pod")
    # Its pods are units of their own: the Deployment holds nothing.
    per_pod = True

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        return ()
