"""Partial admission through the loop (DESIGN §12): a Job annotated
`arbiter.dev/min-parallelism` runs with as many pods as fit (never fewer
than that), its parallelism set while it is still suspended."""

from __future__ import annotations

from typing import Any

from arbiter.base.kubeapi import job_path
from arbiter.core.api import MIN_PARALLELISM_ANNOTATION, QUEUE_LABEL
from tests.loop.harness import Cluster

NS = "team"


async def job(cluster: Cluster, name: str, parallelism: int, minimum: str | None,
              **spec: Any) -> None:
    annotations = {MIN_PARALLELISM_ANNOTATION: minimum} if minimum is not None else {}
    await cluster.api.create(job_path(NS), {
        "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_LABEL: "q"},
                     "annotations": annotations},
        "spec": {"suspend": True, "parallelism": parallelism, **spec,
                 "template": {"spec": {"containers": [
                     {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}},
    })


def job_spec(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(cluster.api.objects[job_path(NS, name)]["spec"])


async def test_a_job_runs_with_as_many_pods_as_fit() -> None:
    cluster = Cluster()
    await cluster.nodes(5)
    await cluster.queue("q")
    await job(cluster, "wide", 8, "3")
    await cluster.settle()
    assert cluster.phase(NS, "job-wide") == "Dequeued"
    spec = job_spec(cluster, "wide")
    assert spec["parallelism"] == 5 and spec["suspend"] is False
    unit = cluster.unit_obj(NS, "job-wide")
    assert unit["spec"]["podSets"][0]["minCount"] == 3
    assert unit["status"]["admissions"][-1]["replicas"] == {"main": 5}
    assert unit["status"]["allocated"] == {"cpu": "5"}
    assert cluster.controller.mirror.engine.allocated("q") == {"cpu": 5000}
    plan = unit["status"]["admission"]["nodes"]["main"]
    assert len(plan) == 5 and len(set(plan)) == 5


async def test_without_the_annotation_or_below_the_minimum_it_waits() -> None:
    cluster = Cluster()
    await cluster.nodes(5)
    await cluster.queue("q")
    await job(cluster, "whole", 8, None)
    await job(cluster, "picky", 8, "6")
    await cluster.settle()
    assert cluster.phase(NS, "job-whole") in (None, "Enqueued")
    assert cluster.phase(NS, "job-picky") in (None, "Enqueued")
    assert job_spec(cluster, "whole")["suspend"] is True
    assert job_spec(cluster, "picky")["parallelism"] == 8


async def test_whole_units_go_first_and_the_shrunk_one_takes_what_is_left() -> None:
    cluster = Cluster()
    await cluster.nodes(6)
    await cluster.queue("q")
    await job(cluster, "early", 8, "2")
    await job(cluster, "small", 2, None)
    await cluster.settle()
    assert job_spec(cluster, "small")["suspend"] is False
    assert job_spec(cluster, "early")["parallelism"] == 4


async def test_equal_completions_of_an_indexed_job_follow_parallelism() -> None:
    cluster = Cluster()
    await cluster.nodes(4)
    await cluster.queue("q")
    await job(cluster, "indexed", 6, "2", completions=6, completionMode="Indexed")
    await job(cluster, "plain", 6, "1", completions=6)
    await cluster.settle()
    indexed, plain = job_spec(cluster, "indexed"), job_spec(cluster, "plain")
    assert (indexed["parallelism"], indexed["completions"]) == (4, 4)
    # The rest after the indexed Job took 4 of the 4 CPUs: nothing left, it waits.
    assert plain["suspend"] is True and plain["completions"] == 6
