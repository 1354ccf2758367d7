"""One decision of which unit holds a pod, shared by the loop and the extender."""

from __future__ import annotations

from arbiter.cache.ownership import ConsumerKey, pod_consumer
from arbiter.cache.records import JobRecord, PodRecord
from arbiter.core.api import MAX_NAME
from arbiter.core.resources import Resources
from arbiter.loop.units import group_unit, job_unit, pod_unit, wants_pod_unit
from extender.state import unit_key

CPU = Resources.parse({"cpu": "1"})


def pod(name: str, **fields: object) -> PodRecord:
    base: dict[str, object] = {"uid": f"uid-{name}", "namespace": "ns", "name": name,
                               "requests": CPU, "queue": "q", "gated": True}
    base.update(fields)
    return PodRecord(**base)  # type: ignore[arg-type]


def test_a_pod_belongs_to_its_job_else_its_group_else_itself() -> None:
    assert pod_consumer(pod("p", job_name="train")) == ConsumerKey("Job", "ns", "train")
    assert pod_consumer(pod("p", pod_group="g")) == ConsumerKey("PodGroup", "ns", "g")
    assert pod_consumer(pod("p", job_name="train", pod_group="g")).kind == "Job"
    assert pod_consumer(pod("p")) == ConsumerKey("Pod", "ns", "p")


def test_unit_names_by_kind_and_a_long_name_is_cut_with_a_hash() -> None:
    assert ConsumerKey("Job", "ns", "a").unit_key == "ns/job-a"
    assert ConsumerKey("PodGroup", "ns", "a").unit_key == "ns/group-a"
    assert ConsumerKey("Pod", "ns", "a").unit_key == "ns/pod-a"
    long = ConsumerKey("Pod", "ns", "x" * 300).unit_name
    assert len(long) == MAX_NAME and long != ConsumerKey("Pod", "ns", "x" * 299).unit_name


def test_the_unit_the_loop_creates_is_the_one_the_extender_looks_up() -> None:
    lone = pod("lone")
    assert wants_pod_unit(lone)
    made = pod_unit(lone)
    assert made is not None and made.key == unit_key(lone)

    members = [pod(f"m{i}", pod_group="g", pod_group_size=2) for i in range(2)]
    group = group_unit("ns", "g", members)
    assert group is not None and not wants_pod_unit(members[0])
    assert {unit_key(m) for m in members} == {group.key}

    job = JobRecord(uid="uid-j", namespace="ns", name="j" * 260, queue="q",
                    pod_requests=CPU)
    job_pod = pod("worker", job_name=job.name, gated=False)
    made_for_job = job_unit(job, {})
    assert made_for_job is not None and not wants_pod_unit(job_pod)
    assert made_for_job.key == unit_key(job_pod)


def test_a_gated_pod_of_a_job_arbiter_does_not_hold_is_its_own_unit_for_both() -> None:
    # Item 13: the webhook gated it (its Job has no queue); the loop makes it
    # a pod unit and the extender finds that unit, not a Job unit that will
    # never exist.
    from arbiter.cache.ownership import holding_unit
    from arbiter.cache.records import OwnerRef, PodSet, UnitRecord

    stray = pod("legacy-a", job_name="legacy")
    made = pod_unit(stray)
    assert wants_pod_unit(stray) and made is not None and made.key == "ns/pod-legacy-a"
    unit = UnitRecord(uid="u", namespace="ns", name="pod-legacy-a", queue="q",
                      pod_sets=(PodSet("main", 1, CPU),),
                      consumer=OwnerRef("Pod", "legacy-a", stray.uid), phase="Dequeued")
    released = pod("legacy-a", job_name="legacy", gated=False)
    assert holding_unit(released, {unit.key: unit}) == ("ns/pod-legacy-a", unit)
    # A namesake's unit (another uid) does not hold it; its Job's would.
    other = pod("legacy-a", job_name="legacy", gated=False, uid="uid-other")
    assert holding_unit(other, {unit.key: unit}) == ("ns/job-legacy", None)


def test_a_jobs_unit_named_apart_is_found_by_its_uid_in_the_store() -> None:
    # A Job deleted with --cascade=orphan leaves `job-train` (its uid) behind;
    # the new Job `train` gets `job-train-<uid>`. Its pods, the extender and
    # the webhook must find the new unit, never the namesake.
    from arbiter.cache.ownership import holding_unit
    from arbiter.cache.records import OwnerRef, PodSet, UnitRecord
    from arbiter.cache.store import ClusterStore

    store = ClusterStore()
    stale = UnitRecord(uid="u1", namespace="ns", name="job-train", queue="q",
                       pod_sets=(PodSet("main", 1, CPU),),
                       consumer=OwnerRef("Job", "train", "uid-old"), phase="Dequeued")
    fresh = UnitRecord(uid="u2", namespace="ns", name="job-train-uid-new", queue="q",
                       pod_sets=(PodSet("main", 1, CPU),),
                       consumer=OwnerRef("Job", "train", "uid-new"), phase="Dequeued")
    for unit in (stale, fresh):
        store._put_record("QueueUnit", unit.key, unit)
    worker = pod("w", job_name="train", job_uid="uid-new", gated=False)
    assert holding_unit(worker, store.units, store.unit_by_consumer_uid) == (fresh.key, fresh)
    assert store.unit_for_consumer("ns", "uid-old") is stale
    assert store.unit_for_consumer("other-ns", "uid-new") is None
    # Gone from the index with the unit; the name lookup is all that is left.
    store._put_record("QueueUnit", fresh.key, None)
    assert store.unit_for_consumer("ns", "uid-new") is None
    assert holding_unit(worker, store.units, store.unit_by_consumer_uid) == (stale.key, stale)
