"""Reality is charged (DESIGN §13, issue #25 rows 2-7, 11, 13): bound pods
count against exactly one queue, matched by uid, whatever a tenant did to
labels, names, units or its consumer."""

from __future__ import annotations

from typing import Any

from arbiter.base import metrics
from arbiter.base.kubeapi import job_path, pod_path, unit_path
from arbiter.core.api import QUEUE_LABEL
from arbiter.core.resources import Resources
from arbiter.loop.mirror import UNQUEUED_PREFIX
from tests.loop.harness import Cluster


def cpu(cores: str) -> Resources:
    return Resources.parse({"cpu": cores})


def charged(c: Cluster) -> dict[str, tuple[Resources, int]]:
    return c.controller.charges.usage(c.store)


def allocated(c: Cluster, queue: str) -> Resources:
    return c.controller.mirror.engine.allocated(queue)


async def team(c: Cluster, *, nodes: int = 4, **spec: Any) -> None:
    """Queue `q` listing namespace `ns` (its default queue), on 1-CPU nodes."""
    await c.nodes(nodes)
    await c.queue("q", namespaces=["ns"], **spec)


async def test_a_pod_bound_at_creation_is_unqueued_usage_of_its_namespace_queue() -> None:
    c = Cluster()
    await team(c, capability={"cpu": "2"})
    await c.pod("ns", "pinned", "q", gated=False, node="node-0", phase="Running")
    await c.settle()
    assert charged(c) == {"q": (cpu("1"), 1)}
    assert allocated(c, "q") == cpu("1")  # counted in shares and capability
    await c.job("ns", "big", "q", parallelism=2)
    await c.settle()
    assert c.suspended("ns", "big")  # 1 + 2 > capability 2
    c.clock.advance(5)
    await c.controller.publisher.publish()
    await c.settle()  # the status write is one of the loop's writes
    status = c.queue_status("q")
    assert status["unqueued"] == {"cpu": "1"} and status["unqueuedPods"] == 1
    sample = metrics.REGISTRY.get_sample_value(
        "arbiter_queue_unqueued", {"queue": "q", "resource": "cpu"})
    assert sample == 1.0
    await c.api.delete(pod_path("ns", "pinned"))
    await c.settle()
    assert charged(c) == {} and not c.suspended("ns", "big")


async def test_the_pods_label_never_moves_the_charge() -> None:
    """Row 11: relabelling a running pod with another queue's name."""
    c = Cluster()
    await team(c)
    await c.queue("other")
    await c.pod("ns", "pinned", "q", gated=False, node="node-0", phase="Running")
    await c.settle()

    def relabel(obj: dict[str, Any]) -> None:
        obj["metadata"]["labels"][QUEUE_LABEL] = "other"

    c.api.edit(pod_path("ns", "pinned"), relabel)
    await c.settle()
    assert charged(c) == {"q": (cpu("1"), 1)} and allocated(c, "other") == Resources()


async def test_an_orphan_deleted_job_keeps_its_room_until_its_pods_are_gone() -> None:
    """Row 4: `kubectl delete job --cascade=orphan` after admission."""
    c = Cluster()
    await team(c, nodes=2)
    await c.job("ns", "first", "q", parallelism=2)
    await c.settle()
    assert not c.suspended("ns", "first")
    for index in range(2):
        await c.job_pod("ns", "first", f"first-{index}", node=f"node-{index}")
    await c.settle()
    assert charged(c) == {}  # covered by its unit
    await c.orphan_delete(job_path("ns", "first"))
    await c.job("ns", "second", "q", parallelism=2)
    await c.settle()
    assert charged(c) == {"q": (cpu("2"), 2)}
    assert c.suspended("ns", "second")  # not admitted into the orphans' room
    for index in range(2):
        await c.api.delete(pod_path("ns", f"first-{index}"))
    await c.settle()
    assert not c.suspended("ns", "second")


async def test_pods_beyond_an_admitted_jobs_parallelism_are_charged() -> None:
    """Row 5, the backstop: parallelism raised after admission (the webhook
    bypassed): the extra pods count against the Job's queue."""
    c = Cluster()
    await team(c, nodes=4)
    job = await c.job("ns", "grow", "q", parallelism=1)
    await c.settle()
    for index in range(3):
        await c.job_pod("ns", "grow", f"grow-{index}", node=f"node-{index}")
    await c.settle()
    assert charged(c) == {"q": (cpu("2"), 2)}
    assert allocated(c, "q") == cpu("3")
    assert job["metadata"]["uid"] == c.unit_obj("ns", "job-grow")["spec"]["consumerRef"]["uid"]
    await c.job("ns", "next", "q", parallelism=2)
    await c.settle()
    assert c.suspended("ns", "next")  # 3 of 4 CPUs used: 2 more do not fit


async def test_a_resized_pod_is_charged_what_it_asks_now() -> None:
    """Row 13, the backstop: `pods/resize` 1 -> 3 CPU after admission."""
    c = Cluster()
    await team(c, nodes=4)
    await c.pod("ns", "p", "q")
    await c.settle()
    assert not c.gated("ns", "p")

    def bind_and_grow(obj: dict[str, Any]) -> None:
        obj["spec"]["nodeName"] = "node-0"
        obj["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
        obj["status"]["phase"] = "Running"

    c.api.edit(pod_path("ns", "p"), bind_and_grow)
    await c.settle()
    # Its unit covers 1 CPU; 3 do not fit in that: the pod is unqueued usage.
    assert charged(c) == {"q": (cpu("3"), 1)}
    assert allocated(c, "q") == cpu("4")


async def test_a_group_releases_only_the_pods_admitted_with_it() -> None:
    """Row 6: pods labelled into an admitted group afterwards stay gated."""
    c = Cluster()
    await team(c, nodes=8)
    for index in range(2):
        await c.pod("ns", f"g-{index}", "q", group="g", size=2)
    await c.settle()
    assert c.released_pods("ns") == ["g-0", "g-1"]
    members = c.unit_obj("ns", "group-g")["status"]["admittedPods"]
    assert len(members) == 2
    # Released pods lose their gate; the next gated ones join by label.
    for index in range(2, 6):
        await c.pod("ns", f"g-{index}", "q", group="g", size=2)
    await c.settle()
    c.clock.advance(1)
    await c.settle()
    assert c.released_pods("ns") == ["g-0", "g-1"]
    assert all(c.gated("ns", f"g-{index}") for index in range(2, 6))


async def test_a_patched_down_waiting_unit_is_admitted_at_its_consumers_size() -> None:
    """Row 7: a tenant patches a waiting Job unit's podSets down; it is never
    admitted small, and comes back to the Job's demand."""
    c = Cluster()
    await team(c, nodes=3)  # 1 CPU free once hog runs: 10m would fit, 2 x 1 CPU not
    await c.job("ns", "hog", "q", parallelism=2)
    await c.settle()
    job = await c.job("ns", "big", "q", parallelism=2)
    await c.settle()
    assert c.store.units["ns/job-big"].phase == "Enqueued"
    await c.api.merge_patch(unit_path("ns", "job-big"), {"spec": {"podSets": [
        {"name": "main", "count": 1, "requests": {"cpu": "10m"}}], "priority": 1000}})
    await c.settle()
    spec = c.unit_obj("ns", "job-big")["spec"]
    assert spec["podSets"][0]["count"] == 2 and spec["podSets"][0]["requests"] == {"cpu": "1"}
    assert spec["priority"] == 0
    assert c.store.units["ns/job-big"].phase == "Enqueued" and c.suspended("ns", "big")
    c.finish_job("ns", "hog")
    await c.settle()
    assert c.phase("ns", "job-big") == "Dequeued"
    assert c.unit_obj("ns", "job-big")["status"]["allocated"] == {"cpu": "2"}
    assert job["metadata"]["uid"] == c.unit_obj("ns", "job-big")["spec"]["consumerRef"]["uid"]


async def test_the_drift_is_never_admitted_even_before_it_is_corrected() -> None:
    """Row 7's race: the cycle that sees the edit admits nothing small, even
    while the correcting write has not landed."""
    c = Cluster()
    await team(c, nodes=2)
    await c.job("ns", "hog", "q", parallelism=1)
    await c.job("ns", "big", "q", parallelism=4)
    await c.settle()
    assert c.store.units["ns/job-big"].phase == "Enqueued"

    def shrink(obj: dict[str, Any]) -> None:
        obj["spec"]["podSets"] = [{"name": "main", "count": 1, "requests": {"cpu": "10m"}}]

    c.api.edit(unit_path("ns", "job-big"), shrink)
    c.controller.cycle()  # sees the small spec, before any write of ours
    assert "ns/job-big" not in c.controller.mirror.entries
    await c.settle()
    assert c.store.units["ns/job-big"].phase == "Enqueued" and c.suspended("ns", "big")


async def test_unqueued_pods_are_reclaimed_for_a_starving_queue() -> None:
    """Unqueued usage is reclaimable: the reclaimer evicts such a pod."""
    from tests.reclaim.test_loop import GRACE, ReclaimCluster

    c = ReclaimCluster()
    await c.nodes(4)
    await c.queue("a", namespaces=["na"])
    await c.queue("b", namespaces=["nb"])
    for index in range(4):
        await c.pod("na", f"pinned-{index}", "a", gated=False, node=f"node-{index}",
                    phase="Running")
    await c.settle()
    assert charged(c) == {"a": (cpu("4"), 4)}
    await c.pod("nb", "wants", "b")
    await c.settle()
    assert c.gated("nb", "wants")
    await c.look()
    await c.look(GRACE)
    assert len(c.evicting.evicted) == 1 and c.evicting.evicted[0].startswith("pinned-")
    await c.look()
    assert not c.gated("nb", "wants")
    assert charged(c) == {"a": (cpu("3"), 3)}


async def test_a_namespace_without_a_queue_takes_the_capacity() -> None:
    """No queue to charge: the pod's requests come off the capacity."""
    c = Cluster()
    await c.nodes(2)
    await c.queue("q")
    await c.pod("loose", "pinned", "q", gated=False, node="node-0", phase="Running")
    await c.job("ns", "two", "q", parallelism=2)
    await c.settle()
    assert charged(c) == {"": (cpu("1"), 1)}
    assert allocated(c, "q") == Resources() and c.suspended("ns", "two")
    assert all(key.startswith(UNQUEUED_PREFIX) for key in c.controller.mirror.entries
               if c.controller.mirror.state(key) == "orphan")


async def test_a_new_leaders_first_look_at_every_pod_is_spread_over_cycles() -> None:
    """The backstop looks at `batch` pods a cycle at most (a large cache
    must not stall the event loop), and gets through them all."""
    from arbiter.loop.settings import LoopSettings

    c = Cluster(LoopSettings(debounce=0.0, batch=2))
    await team(c, nodes=4)
    for index in range(20):
        await c.pod("ns", f"pinned-{index}", "q", cpu="100m", gated=False,
                    node=f"node-{index % 4}", phase="Running")
    c.controller.cycle(budget=2)
    assert 0 < len(c.controller.charges.charged) <= 2
    await c.settle()
    assert charged(c) == {"q": (cpu("2"), 20)}


async def test_unqueued_usage_counts_in_a_parents_capability() -> None:
    """Hierarchical queues (DESIGN §11): a child's unqueued usage is its
    subtree's too."""
    c = Cluster()
    await c.nodes(4)
    await c.queue("org", capability={"cpu": "2"})
    await c.queue("team", parent="org", namespaces=["ns"])
    await c.pod("ns", "pinned", "team", gated=False, node="node-0", phase="Running")
    await c.job("ns", "two", "team", parallelism=2)
    await c.settle()
    assert charged(c) == {"team": (cpu("1"), 1)} and allocated(c, "team") == cpu("1")
    assert c.suspended("ns", "two")  # 1 + 2 > the parent's capability 2


async def test_pods_of_a_unit_naming_a_foreign_queue_are_charged_to_their_namespaces() -> None:
    """A Job in `a` labelled with team-b's queue, released around arbiter (the
    webhook bypassed): its unit is barred, so its running pods are unqueued
    usage, and they count against `a`'s own queue, never the one that
    refuses `a`."""
    c = Cluster()
    await c.nodes(4)
    await c.queue("team-a", namespaces=["a"])
    await c.queue("team-b", namespaces=["b"])
    await c.job("a", "sneaky", "team-b", parallelism=2)
    await c.settle()
    assert c.suspended("a", "sneaky")
    for index in range(2):
        await c.job_pod("a", "sneaky", f"sneaky-{index}", node=f"node-{index}")
    await c.settle()
    assert charged(c) == {"team-a": (cpu("2"), 2)}
    assert allocated(c, "team-b") == Resources()
