"""The extender and a Job admitted at creation (DESIGN §16): its pods may be
placed before its unit is seen, on arbiter's own record (the Job's token,
checked with the key), never on a tenant's annotation."""

from __future__ import annotations

from typing import Any

from arbiter.cache.convert import job_from_api
from arbiter.cache.fastpath import job_demand
from arbiter.core.api import QUEUE_LABEL
from arbiter.core.fastpath import FAST_PATH_ANNOTATION, FastPathToken, derive_key, sign
from extender.filter import filter_nodes
from extender.wire import parse_extender_args
from tests.extender import builders as b
from tests.extender.builders import World

KEY = derive_key(b"the CA key")
CREATED = 1_735_689_600.0  # 2025-01-01T00:00:00Z


def job(name: str, *, token: str | None, suspend: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "team-a",
                     "uid": b.consumer_uid("Job", "team-a", name),
                     "creationTimestamp": "2025-01-01T00:00:00Z",
                     "labels": {QUEUE_LABEL: "a"}, "annotations": {}},
        "spec": {"suspend": suspend, "parallelism": 1, "template": {"spec": {"containers": [
            {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}},
    }
    if token is not None:
        obj["metadata"]["annotations"][FAST_PATH_ANNOTATION] = token
    return obj


def signed(name: str) -> str:
    record = job_from_api(job(name, token=None))
    return sign(KEY, "team-a", name, FastPathToken(f"job-{name}", "a", "", int(CREATED * 1000)),
                job_demand(record))


def verdict(world: World, name: str) -> str:
    pod = b.pod(f"{name}-x", job=name)
    return filter_nodes(world.state, parse_extender_args(
        b.extender_args(pod, sorted(world.store.nodes)))).verdict


def test_a_job_admitted_at_creation_has_its_pods_placed_before_its_unit_is_seen() -> None:
    world = World(fast_path_key=KEY)
    world.nodes(2)
    world.queue("a")
    world.add("Job", job("fast", token=signed("fast")))
    assert verdict(world, "fast") == "passed"


def test_a_tenants_token_or_a_suspended_job_places_nothing() -> None:
    world = World(fast_path_key=KEY)
    world.nodes(2)
    world.queue("a")
    world.add("Job", job("forged", token=signed("forged")[:-4] + "beef"))
    world.add("Job", job("other", token=signed("fast")))  # another Job's token
    world.add("Job", job("held", token=signed("held"), suspend=True))
    assert verdict(world, "forged") == "rejected"
    assert verdict(world, "other") == "rejected"
    assert verdict(world, "held") == "rejected"
    keyless = World()
    keyless.nodes(1)
    keyless.queue("a")
    keyless.add("Job", job("fast", token=signed("fast")))
    assert verdict(keyless, "fast") == "rejected"


def test_a_job_let_go_with_its_status_write_has_its_pods_placed() -> None:
    """The loop sends a Job's unsuspend with its unit's status write: an
    unsuspended Job whose unit still reads Enqueued here is admitted; a
    suspended one is not."""
    world = World()
    world.nodes(2)
    world.queue("a")
    world.add("Job", job("released", token=None))
    world.unit("team-a", "job-released", "a", phase="Enqueued")
    world.add("Job", job("waiting", token=None, suspend=True))
    world.unit("team-a", "job-waiting", "a", phase="Enqueued")
    assert verdict(world, "released") == "passed"
    assert verdict(world, "waiting") == "rejected"
