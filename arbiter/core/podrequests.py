"""A pod's effective resource requests, computed the way Kubernetes does.

effective = max(sum of app containers + restartable (sidecar) init
containers, the largest (non-sidecar init container + sidecars started
before it)) + pod overhead. A resource a container (or the pod) sets only
in `limits` is requested at its limit, as the apiserver defaults it.
Pod-level `spec.resources` (PodLevelResources) replace the container sum
for the resources they name; the rest (extended resources) is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arbiter.core.quantities import QuantityError
from arbiter.core.resources import EMPTY, Resources


def defaulted_requests(resources: Any, field: str) -> Resources:
    """Requests of a `resources` block, each resource set only in `limits`
    requested at its limit (the apiserver defaults them per resource)."""
    if resources is None:
        return EMPTY
    if not isinstance(resources, Mapping):
        raise QuantityError(f"{field}: must be an object")
    raw_requests = resources.get("requests")
    requests = Resources.parse(raw_requests, field=f"{field}.requests")
    limits = Resources.parse(resources.get("limits"), field=f"{field}.limits")
    # An explicit request (even 0, which Resources drops) wins over the limit.
    stated = raw_requests.keys() if isinstance(raw_requests, Mapping) else ()
    from_limits = {name: amount for name, amount in limits.items() if name not in stated}
    return requests + from_limits if from_limits else requests


def _container_requests(container: Any, field: str) -> Resources:
    if not isinstance(container, Mapping):
        raise QuantityError(f"{field}: must be an object")
    return defaulted_requests(container.get("resources"), f"{field}.resources")


def _containers(spec: Mapping[str, Any], key: str) -> list[Any]:
    value = spec.get(key) or []
    if not isinstance(value, list):
        raise QuantityError(f"spec.{key}: must be a list")
    return value


def effective_pod_requests(spec: Mapping[str, Any]) -> Resources:
    """Requests of one pod from its `spec`; raises QuantityError naming the field."""
    total = EMPTY
    for index, container in enumerate(_containers(spec, "containers")):
        total = total + _container_requests(container, f"spec.containers[{index}]")

    sidecars = EMPTY
    init_peak = EMPTY
    for index, container in enumerate(_containers(spec, "initContainers")):
        requests = _container_requests(container, f"spec.initContainers[{index}]")
        if container.get("restartPolicy") == "Always":
            # A sidecar keeps running next to everything started after it.
            sidecars = sidecars + requests
            init_peak = init_peak.maximum(sidecars)
        else:
            init_peak = init_peak.maximum(sidecars + requests)
    total = (total + sidecars).maximum(init_peak)

    # Pod-level resources replace the containers' sum resource by resource;
    # what they do not name (GPUs, other extended resources) is kept.
    pod_level = defaulted_requests(spec.get("resources"), "spec.resources")
    if pod_level:
        total = Resources({**total, **pod_level})

    overhead = spec.get("overhead")
    if overhead:
        total = total + Resources.parse(overhead, field="spec.overhead")
    return total
