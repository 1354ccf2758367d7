"""StatefulSet (`apps/v1`): one gang unit of `replicas` pods, made from the
spec before any pod exists; its pods arrive gated and are let go while the
unit is admitted (OrderedReady creates them one by one: each is let go as
it comes). Serving: reclaim evicts the pods and the unit waits again; a
replica change while admitted is re-held and queued at the new size;
scaled to 0 it needs no unit."""

from __future__ import annotations

from arbiter.core.model import MAIN_POD_SET
from arbiter.integrations.base import (
    Integration,
    Obj,
    Path,
    PodSetSpec,
    UnitSpec,
    count_at,
    template_requests,
)

TEMPLATE: Path = ("spec", "template")


class StatefulSet(Integration):
    name = "statefulset"
    group = "apps"
    version = "v1"
    resource = "statefulsets"
    kind = "StatefulSet"
    prefix = "sts"
    hold = "gate"
    children = ("Pod",)
    sized_by = "spec.replicas"

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        replicas = count_at(obj, ("spec", "replicas"))
        requests = template_requests(obj, TEMPLATE)
        if replicas is None or requests is None:
            return None
        if replicas == 0:
            return ()
        return (UnitSpec("", (PodSetSpec(MAIN_POD_SET, replicas, requests, TEMPLATE),)),)
