"""A pod's effective resource requests, computed the way Kubernetes does.

effective = max(sum of app containers + restartable (sidecar) init
containers, the largest (non-sidecar init container + sidecars started
before it)) + pod overhead. Pod-level `spec.resources.requests`, when set,
replaces the container sum (PodLevelResources).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arbiter.core.resources import EMPTY, Resources


def _container_requests(container: Mapping[str, Any], field: str) -> Resources:
    resources = container.get("resources") or {}
    requests = resources.get("requests")
    if requests is None:
        # Kubernetes defaults requests to limits when only limits are given.
        requests = resources.get("limits")
    return Resources.parse(requests, field=f"{field}.resources.requests")


def effective_pod_requests(spec: Mapping[str, Any]) -> Resources:
    """Requests of one pod from its `spec`; raises QuantityError naming the field."""
    containers = spec.get("containers") or []
    total = EMPTY
    for index, container in enumerate(containers):
        total = total + _container_requests(container, f"spec.containers[{index}]")

    sidecars = EMPTY
    init_peak = EMPTY
    for index, container in enumerate(spec.get("initContainers") or []):
        requests = _container_requests(container, f"spec.initContainers[{index}]")
        if container.get("restartPolicy") == "Always":
            # A sidecar keeps running next to everything started after it.
            sidecars = sidecars + requests
            init_peak = init_peak.maximum(sidecars)
        else:
            init_peak = init_peak.maximum(sidecars + requests)
    total = (total + sidecars).maximum(init_peak)

    pod_resources = spec.get("resources") or {}
    if pod_resources.get("requests"):
        total = Resources.parse(pod_resources["requests"], field="spec.resources.requests")

    overhead = spec.get("overhead")
    if overhead:
        total = total + Resources.parse(overhead, field="spec.overhead")
    return total
