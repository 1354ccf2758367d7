"""A Job admitted again, into another pool (DESIGN §10): the earlier pool's
nodeSelector and tolerations come off its pod template, what the user set
stays."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from arbiter.base.kubeapi import ApiError, Invalid, job_path
from arbiter.cache.records import Toleration
from arbiter.core.api import PLACED_ANNOTATION, QUEUE_LABEL
from arbiter.loop.actions import Actions
from arbiter.loop.placement import PodDirectives, job_release_ops
from arbiter.loop.settings import LoopSettings
from arbiter.testing.memory import InMemoryApi, json_patch
from tests.loop.harness import Cluster
from tests.loop.test_placement import node, pool

USER_TOLERATION = {"key": "spot", "operator": "Exists"}
GPU_TOLERATION = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}


def template(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(cluster.api.objects[job_path("ns", name)]["spec"]["template"]["spec"])


def job_annotations(cluster: Cluster, name: str) -> dict[str, str]:
    return dict(cluster.api.objects[job_path("ns", name)]["metadata"].get("annotations") or {})


async def fill(cluster: Cluster, node_name: str) -> None:
    """An unmanaged pod takes the whole node (so the next admission goes elsewhere)."""
    await cluster.pod("other", f"fill-{node_name}", None, cpu="1", gated=False,
                      node=node_name, phase="Running")


async def test_a_job_admitted_again_into_another_pool_loses_the_first_pools_directives() -> None:
    cluster = Cluster(LoopSettings(debounce=0.0, admission_timeout=60.0, backoff_base=10.0,
                                   backoff_max=100.0))
    cluster.controller.rng = random.Random(0)
    await node(cluster, "a0", pool="a")
    await node(cluster, "b0", tier="b")
    await node(cluster, "d0")
    await pool(cluster, "a", {"pool": "a"}, tolerations=[GPU_TOLERATION])
    await pool(cluster, "b", {"tier": "b"})
    await cluster.queue("q", pools=["a", "b", "default"])
    await cluster.job("ns", "train", "q")

    def user_settings(job: dict[str, Any]) -> None:
        job["spec"]["template"]["spec"].update(nodeSelector={"disk": "ssd"},
                                               tolerations=[USER_TOLERATION])

    cluster.api.edit(job_path("ns", "train"), user_settings)
    await cluster.settle()
    spec = template(cluster, "train")
    assert spec["nodeSelector"] == {"disk": "ssd", "pool": "a"}
    assert spec["tolerations"] == [USER_TOLERATION, GPU_TOLERATION]
    assert json.loads(job_annotations(cluster, "train")[PLACED_ANNOTATION])["nodeSelector"] == {
        "pool": "a"}

    # It never starts; meanwhile pool a fills up. Timed out, held, backed
    # off, admitted again: into pool b, with nothing of pool a's left.
    await fill(cluster, "a0")
    cluster.clock.advance(61)
    await cluster.settle()
    assert cluster.suspended("ns", "train")
    cluster.clock.advance(16)
    await cluster.settle()
    assert not cluster.suspended("ns", "train")
    assert cluster.unit_obj("ns", "job-train")["status"]["admission"]["pool"] == "b"
    spec = template(cluster, "train")
    assert spec["nodeSelector"] == {"disk": "ssd", "tier": "b"}
    assert spec["tolerations"] == [USER_TOLERATION]

    # Once more, into the pool `default`, which gives nothing: what arbiter
    # added comes off all the same, and so does its record.
    await fill(cluster, "b0")
    cluster.clock.advance(61)
    await cluster.settle()
    cluster.clock.advance(31)
    await cluster.settle()
    assert not cluster.suspended("ns", "train")
    assert cluster.unit_obj("ns", "job-train")["status"]["admission"]["pool"] == "default"
    spec = template(cluster, "train")
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert spec["tolerations"] == [USER_TOLERATION]
    assert PLACED_ANNOTATION not in job_annotations(cluster, "train")
    assert cluster.admissions("ns", "job-train") == 3


def suspended_job(selector: dict[str, str] | None = None,
                  annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": []}
    if selector is not None:
        spec["nodeSelector"] = selector
    meta: dict[str, Any] = {"uid": "u1", "resourceVersion": "7"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"suspend": True, "template": {"spec": spec}}}


def release(job: dict[str, Any], directives: PodDirectives) -> dict[str, Any]:
    released: dict[str, Any] = json_patch(job, job_release_ops(job, directives))
    released["spec"]["suspend"] = True  # suspended again, for the next release
    return released


def selector_of(job: dict[str, Any]) -> dict[str, str] | None:
    value = job["spec"]["template"]["spec"].get("nodeSelector")
    return dict(value) if value is not None else None


def test_a_user_value_arbiter_replaced_comes_back_and_a_user_change_is_kept() -> None:
    zone_a = PodDirectives((("zone", "a"),))
    zone_b = PodDirectives((("zone", "b"), ("pool", "b")))
    job = release(suspended_job({"zone": "user", "team": "x"}), zone_a)
    assert selector_of(job) == {"zone": "a", "team": "x"}
    job = release(job, zone_b)
    assert selector_of(job) == {"zone": "b", "pool": "b", "team": "x"}
    job = release(job, PodDirectives(undo_earlier=True))
    assert selector_of(job) == {"zone": "user", "team": "x"}  # the user's value, back
    assert PLACED_ANNOTATION not in job["metadata"]["annotations"]
    # The user changes a key arbiter set, while suspended: it is theirs now.
    job = release(suspended_job(annotations={"note": "n"}), zone_b)
    job["spec"]["template"]["spec"]["nodeSelector"]["pool"] = "mine"
    job = release(job, PodDirectives(undo_earlier=True))
    assert selector_of(job) == {"pool": "mine"}
    assert job["metadata"]["annotations"] == {"note": "n"}


def test_tolerations_arbiter_added_are_replaced_and_a_mangled_record_undoes_nothing() -> None:
    gpu = PodDirectives(tolerations=(Toleration("gpu", "Exists", effect="NoSchedule"),))
    job = release(suspended_job(), gpu)
    assert job["spec"]["template"]["spec"]["tolerations"] == [GPU_TOLERATION]
    job = release(job, PodDirectives(undo_earlier=True))
    assert "tolerations" not in job["spec"]["template"]["spec"]
    assert "nodeSelector" not in job["spec"]["template"]["spec"]
    mangled = suspended_job({"pool": "a"}, {PLACED_ANNOTATION: "{not json"})
    job = release(mangled, PodDirectives(undo_earlier=True))
    assert selector_of(job) == {"pool": "a"}
    assert PLACED_ANNOTATION not in job["metadata"]["annotations"]


def test_a_release_survives_status_writes_but_not_a_spec_or_annotation_change() -> None:
    """The Job controller writes a held Job's status again and again while
    its pods go: a release guarded by the resourceVersion lost every race
    (the chaos run: "kept changing" for minutes). The guards are the
    spec's generation and the labels and annotations as read."""
    job = suspended_job({"team": "x"}, annotations={"note": "n"})
    job["metadata"]["generation"] = 3
    job["metadata"]["labels"] = {QUEUE_LABEL: "q"}  # as the webhook labels a managed Job
    ops = job_release_ops(job, PodDirectives((("pool", "a"),)))
    status_written = json.loads(json.dumps(job))
    status_written["metadata"]["resourceVersion"] = "8"
    status_written["status"] = {"active": 0, "terminating": 2}
    released = json_patch(status_written, ops)
    assert released["spec"]["suspend"] is False
    assert selector_of(released) == {"team": "x", "pool": "a"}
    respecified = json.loads(json.dumps(job))
    respecified["metadata"]["generation"] = 4
    annotated = json.loads(json.dumps(job))
    annotated["metadata"]["annotations"]["other"] = "y"
    moved = json.loads(json.dumps(job))  # another queue: a label, not the spec
    moved["metadata"]["labels"][QUEUE_LABEL] = "other"
    for changed in (respecified, annotated, moved):
        with pytest.raises(Invalid):
            json_patch(changed, ops)
    # With no annotations (the chaos run's Jobs: 841 of them lost the race
    # for minutes) the map is added whole, guarded by its absence: a status
    # write passes, an annotation added since does not.
    bare = suspended_job()
    bare["metadata"]["generation"] = 1
    bare["metadata"]["labels"] = {QUEUE_LABEL: "q"}
    bare_ops = job_release_ops(bare, PodDirectives((("pool", "a"),)))
    assert {"op": "test", "path": "/metadata/annotations", "value": None} in bare_ops
    bare["metadata"]["resourceVersion"] = "8"
    bare["status"] = {"active": 0}
    assert json_patch(bare, bare_ops)["spec"]["suspend"] is False
    bare["metadata"]["annotations"] = {"other": "y"}
    with pytest.raises(Invalid):
        json_patch(bare, bare_ops)


async def test_a_release_refused_on_every_read_says_why() -> None:
    """Four reads, four refusals: the error names the last one (a guard
    that fails on every fresh read is a bug to see, not a race to retry)."""
    api = InMemoryApi()
    job = suspended_job()
    job["metadata"].update(name="train", namespace="ns", generation=1)
    path = job_path("ns", "train")
    uid = (await api.create(path.rsplit("/", 1)[0], job))["metadata"]["uid"]

    def refused(method: str, _path: str, _body: Any) -> ApiError | None:
        return Invalid(422, "Invalid", "spec.suspend: refused") if method == "PATCH" else None

    api.hooks.append(refused)
    with pytest.raises(ApiError) as raised:
        await Actions(api).release_job_placed("ns", "train", uid, PodDirectives())
    assert "kept changing" in str(raised.value) and "spec.suspend: refused" in str(raised.value)
    assert [m for m, _ in api.calls].count("PATCH") == 4


def template_rule(api: InMemoryApi, path: str) -> Any:
    """The apiserver's rule (Kubernetes 1.36, Job strategy): a Job's pod
    template changes only while it is suspended, shows no active pod, and
    has no startTime or a Suspended condition."""

    def hook(method: str, target: str, body: Any) -> ApiError | None:
        if method != "PATCH" or target != path:
            return None
        status = api.objects[path].get("status") or {}
        said = any(c.get("type") == "Suspended" and c.get("status") == "True"
                   for c in status.get("conditions") or [])
        touches = any(op["path"].startswith("/spec/template") for op in body)
        if touches and (status.get("active") or (status.get("startTime") and not said)):
            return Invalid(422, "Invalid", "spec.template: Invalid value: field is immutable")
        return None

    return hook


async def held_again(status: dict[str, Any]) -> tuple[InMemoryApi, str, str]:
    """A Job released once (the Job controller set its startTime), then held
    again; the controller has not seen the suspension yet."""
    api = InMemoryApi()
    job = suspended_job({"pool": "a"})
    job["metadata"].update(name="train", namespace="ns", generation=1)
    path = job_path("ns", "train")
    uid = (await api.create(path.rsplit("/", 1)[0], job))["metadata"]["uid"]
    api.set_status(path, {"startTime": "2026-11-28T21:49:00Z", **status})
    api.hooks.append(template_rule(api, path))
    return api, path, uid


async def test_a_held_job_goes_to_another_pool_before_its_controller_catches_up() -> None:
    """Chaos run 16: 2,786 releases into another pool refused while the
    lagging Job controller had not cleared status.startTime."""
    api, path, uid = await held_again({})
    await Actions(api).release_job_placed("ns", "train", uid, PodDirectives((("pool", "b"),)))
    job = api.objects[path]
    assert job["spec"]["suspend"] is False
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "b"}
    assert "startTime" not in (job.get("status") or {})
    assert [m for m, _ in api.calls].count("PATCH") == 2  # the status, then the release


async def test_a_held_job_with_active_pods_waits_without_a_refused_patch() -> None:
    """Its pods are still there: the template stays as it is until they go,
    and no patch the apiserver would refuse is sent meanwhile (chaos run 17:
    1,524 releases, four refused patches each)."""
    api, path, uid = await held_again({"active": 4})
    with pytest.raises(ApiError) as raised:
        await Actions(api).release_job_placed("ns", "train", uid,
                                              PodDirectives((("pool", "b"),)))
    assert "4 pod(s) of its last admission still active" in str(raised.value)
    assert [m for m, _ in api.calls].count("PATCH") == 0
    assert api.objects[path]["status"]["startTime"] == "2026-11-28T21:49:00Z"
    assert api.objects[path]["spec"]["suspend"] is True
    api.set_status(path, {"active": None})  # the Job controller removed them
    await Actions(api).release_job_placed("ns", "train", uid,
                                          PodDirectives((("pool", "b"),)))
    assert api.objects[path]["spec"]["suspend"] is False


async def test_a_release_that_keeps_the_template_leaves_the_status_alone() -> None:
    api, path, uid = await held_again({})
    await Actions(api).release_job_placed("ns", "train", uid,
                                          PodDirectives((("pool", "a"),)))
    assert api.objects[path]["spec"]["suspend"] is False
    assert api.objects[path]["status"]["startTime"] == "2026-11-28T21:49:00Z"
    assert [p for m, p in api.calls if m == "PATCH"] == [path]
