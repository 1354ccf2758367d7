"""A pod's effective requests, defaulted per resource as the apiserver does
(issue 13, item 12): a resource set only in limits is requested at its limit."""

from __future__ import annotations

from typing import Any

import pytest

from arbiter.core.podrequests import effective_pod_requests
from arbiter.core.quantities import QuantityError


def container(requests: dict[str, Any] | None = None,
              limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "c", "resources": resources, **extra}


def test_a_gpu_only_in_limits_is_requested() -> None:
    spec = {"containers": [container({"cpu": 4}, {"nvidia.com/gpu": 1})]}
    assert dict(effective_pod_requests(spec)) == {"cpu": 4000, "nvidia.com/gpu": 1}


def test_requests_win_over_limits_for_the_same_resource() -> None:
    spec = {"containers": [container({"cpu": "1"}, {"cpu": "2", "memory": "1Gi"})]}
    assert dict(effective_pod_requests(spec)) == {"cpu": 1000, "memory": 2**30}


def test_limits_only_still_default_every_request() -> None:
    spec = {"containers": [container(None, {"cpu": "2", "example.com/fpga": "3"})]}
    assert dict(effective_pod_requests(spec)) == {"cpu": 2000, "example.com/fpga": 3}


def test_init_containers_default_per_resource_too() -> None:
    spec = {"containers": [container({"cpu": "1"})],
            "initContainers": [container({"cpu": "500m"}, {"nvidia.com/gpu": 2})]}
    assert dict(effective_pod_requests(spec)) == {"cpu": 1000, "nvidia.com/gpu": 2}


def test_pod_level_resources_keep_container_extended_resources() -> None:
    spec = {"resources": {"requests": {"cpu": "8", "memory": "4Gi"}},
            "containers": [container({"cpu": "1"}, {"nvidia.com/gpu": 1}),
                           container({"memory": "1Gi"})]}
    assert dict(effective_pod_requests(spec)) == {
        "cpu": 8000, "memory": 4 * 2**30, "nvidia.com/gpu": 1}


def test_pod_level_limits_default_pod_level_requests() -> None:
    spec = {"resources": {"limits": {"cpu": "6"}, "requests": {"memory": "2Gi"}},
            "containers": [container({"cpu": "1", "memory": "1Gi"})]}
    assert dict(effective_pod_requests(spec)) == {"cpu": 6000, "memory": 2 * 2**30}


def test_containers_that_are_not_lists_name_the_field() -> None:
    for key in ("containers", "initContainers"):
        with pytest.raises(QuantityError, match=rf"^spec\.{key}: must be a list$"):
            effective_pod_requests({key: 5})
