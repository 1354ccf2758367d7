"""Pods of a Job arbiter does not hold (issue 13, item 13) on the real
control plane: a Job created while its namespace was opted out carries no
queue and was never suspended by arbiter; once the namespace is managed, the
webhook gates the pods the Job controller creates, and each must be admitted
as its own unit (never left gated for a Job unit that will not exist)."""

from __future__ import annotations

import time

from arbiter.core.api import MANAGED_LABEL, QUEUE_LABEL
from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    QUEUE_SETTLE,
    apply_queue,
    create,
    delete_tenants,
    get,
    job,
    job_complete,
    namespace,
    unique_name,
    units,
    wait_for,
)


def test_a_job_from_an_opted_out_namespace_runs_once_the_namespace_is_managed(
        sandbox: Sandbox) -> None:
    ns, queue_name = unique_name("legacy"), unique_name("q")
    create(sandbox, namespace(ns, labels={MANAGED_LABEL: "false"}))
    apply_queue(sandbox, queue_name, namespaces=[ns])
    try:
        legacy = job("legacy", ns, runs_for="2s")
        legacy["spec"].update(suspend=True, parallelism=2, completions=2)
        create(sandbox, legacy)  # no webhook in an opted-out namespace
        created = get(sandbox, "job", "legacy", "-n", ns)
        assert QUEUE_LABEL not in (created["metadata"].get("labels") or {})

        sandbox.kubectl("label", "namespace", ns, f"{MANAGED_LABEL}-")
        time.sleep(QUEUE_SETTLE)  # the webhook's cache sees the namespace managed
        sandbox.kubectl("patch", "job", "legacy", "-n", ns, "--type=merge",
                        "-p", '{"spec": {"suspend": false}}')

        wait_for("the unlabelled Job to complete",
                 lambda: job_complete(get(sandbox, "job", "legacy", "-n", ns)), timeout=120)
        made = units(sandbox, ns)
        assert len(made) >= 2
        assert {u["spec"]["consumerRef"]["kind"] for u in made} == {"Pod"}
        assert all(u["spec"]["queue"] == queue_name for u in made)
        pods = get(sandbox, "pods", "-n", ns)["items"]
        assert pods and all(p["metadata"]["labels"].get(QUEUE_LABEL) == queue_name
                            for p in pods)  # they did go through the webhook
    finally:
        delete_tenants(sandbox, [ns], [queue_name])
