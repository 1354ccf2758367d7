"""A Job's demand carries resources set only in limits (issue 13, item 12):
the apiserver does not default a Job's pod template, so arbiter must."""

from __future__ import annotations

from arbiter.cache.convert import job_from_api


def test_a_gpu_only_in_limits_is_part_of_the_jobs_demand() -> None:
    job = {"metadata": {"name": "train", "namespace": "ml", "uid": "u1"},
           "spec": {"parallelism": 2, "template": {"spec": {"containers": [{
               "name": "c", "resources": {"requests": {"cpu": 4},
                                          "limits": {"nvidia.com/gpu": 1}}}]}}}}
    record = job_from_api(job)
    assert dict(record.pod_requests) == {"cpu": 4000, "nvidia.com/gpu": 1}
    assert record.parallelism == 2
