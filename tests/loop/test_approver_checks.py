"""`arbiter approve` answers only the approval checks the user may approve
(issue #25 row 16): a SelfSubjectAccessReview per check (verb approve on
the AdmissionCheck by name); the apiserver's policy enforces the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from arbiter.base.kubeapi import Obj
from arbiter.cli.approve import SSAR_PATH, ApprovalError, answer
from arbiter.testing.memory import InMemoryApi
from tests.loop.harness import Cluster
from tests.loop.test_admission_checks import NS, admission_check, check_states


class ReviewingApi(InMemoryApi):
    """InMemoryApi answering SelfSubjectAccessReviews: `approvable` names
    the checks the caller may approve."""

    approvable: frozenset[str] = frozenset()

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj:
        if path != SSAR_PATH:
            return await super().create(path, body)
        name = body["spec"]["resourceAttributes"]["name"]
        return {**body, "status": {"allowed": name in self.approvable}}


async def test_only_the_checks_rbac_names_are_answered() -> None:
    cluster = Cluster()
    cluster.controller.stop_listening()
    api = ReviewingApi(cluster.store, clock=cluster.clock)
    cluster.api = api
    cluster.controller = cluster.new_controller()
    await cluster.nodes(2)
    for name in ("mine", "theirs"):
        await admission_check(cluster, name)
    await cluster.queue("a", admissionChecks=[{"name": "mine"}, {"name": "theirs"}])
    await cluster.job(NS, "big", "a")
    await cluster.settle()
    assert check_states(cluster, "job-big") == {"mine": "Pending", "theirs": "Pending"}
    with pytest.raises(ApprovalError, match="you may approve"):
        await answer(api, NS, "job-big", "Ready")  # may approve neither
    api.approvable = frozenset({"mine"})
    assert await answer(api, NS, "job-big", "Ready") == ["mine"]
    assert check_states(cluster, "job-big") == {"mine": "Ready", "theirs": "Pending"}
