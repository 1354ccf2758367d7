"""Fixtures for end-to-end tests on the real local control plane (`arbiter sandbox`).

Every test under tests/e2e is marked `e2e`: run only them with `pytest -m e2e`,
skip them with `pytest -m "not e2e"`. The session starts one sandbox (10 fake
nodes of 1 CPU / 8Gi, arbiter wired in) in a temporary directory and always
stops it at the end, also on failure or Ctrl-C.

Environment knobs (for working on the tests themselves):
- ARBITER_E2E_NO_ARBITER=1: start the sandbox without arbiter.
- ARBITER_E2E_SANDBOX_DIR=DIR: use the sandbox already running in DIR
  (`arbiter sandbox up --dir DIR --nodes 10 --node-cpu 1 --node-memory 8Gi`)
  and leave it running: saves the start-up on every run.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from arbiter.sandbox import NodeShape, Sandbox

# The shared helpers assert too: show their values on failure, as in a test.
pytest.register_assert_rewrite("tests.e2e.helpers")

E2E_NODES = NodeShape(count=10, cpu="1", memory="8Gi")
# The integration tests' sandbox (`integrated`): tests/e2e/workloads.py.
INTEGRATED_NODES = NodeShape(count=8, cpu="1", memory="8Gi")
_HERE = Path(__file__).resolve().parent
# The session's sandbox, for failure reports (a hook cannot request fixtures).
_ACTIVE: list[Sandbox] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Hooks in a conftest see every collected item, so filter by location.
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)
    # e2e files first: they are the longest, and with several workers
    # (pytest-xdist, scripts/test.sh) the quick unit files then fill the gaps.
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _ACTIVE and item.get_closest_marker("e2e") is not None:
        # The sandbox the test used, when it names one (two may run).
        used = [v for v in getattr(item, "funcargs", {}).values() if isinstance(v, Sandbox)]
        report.sections.append(("sandbox logs (last 25 lines each)",
                                (used or _ACTIVE)[-1].log_tails(25)))
    return report


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A running sandbox for the whole session; torn down afterwards, whatever happens."""
    reuse = os.environ.get("ARBITER_E2E_SANDBOX_DIR")
    if reuse:
        existing = Sandbox(reuse, quiet=True)
        if not existing.healthy():
            pytest.fail(f"ARBITER_E2E_SANDBOX_DIR={reuse}: no healthy sandbox there")
        _ACTIVE.append(existing)
        yield existing
        _ACTIVE.remove(existing)
        return

    with_arbiter = os.environ.get("ARBITER_E2E_NO_ARBITER", "") not in ("1", "true", "yes")
    yield from _started(Sandbox(tmp_path_factory.mktemp("sandbox")), E2E_NODES,
                        arbiter=with_arbiter)


@pytest.fixture(scope="session")
def integrated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A second sandbox, with the JobSet, LeaderWorkerSet, KubeRay and
    Kubeflow Trainer controllers and arbiter queueing them, for the
    test_integration_* files (shared when they run in one session); torn
    down afterwards."""
    yield from _started(Sandbox(tmp_path_factory.mktemp("integrated")), INTEGRATED_NODES,
                        integrations=("jobset", "lws", "ray", "trainer"))


@pytest.fixture(scope="module")
def short_grace(integrated: Sandbox) -> Iterator[None]:
    """The primary arbiter of `integrated` with a 3 s reclaim grace for the
    module that asks (`pytestmark = pytest.mark.usefixtures("short_grace")`)."""
    from tests.e2e.helpers import arbiter_with

    with arbiter_with(integrated, ["--reclaim-grace", "3.0"]):
        yield


def _started(instance: Sandbox, shape: NodeShape, **up: Any) -> Iterator[Sandbox]:
    _ACTIVE.append(instance)
    try:
        failure = None
        try:
            instance.up(shape, **up)
        except Exception as error:
            failure = f"the sandbox did not come up: {error}\n\n{instance.log_tails(40)}"
        if failure is not None:
            pytest.fail(failure, pytrace=False)
        yield instance
    finally:
        _ACTIVE.remove(instance)
        instance.down()


@pytest.fixture(scope="session")
def kube_config_path(sandbox: Sandbox) -> Path:
    """The sandbox's admin kubeconfig (system:masters)."""
    return sandbox.kubeconfig


@pytest.fixture
async def kube_api(kube_config_path: Path) -> AsyncIterator[Any]:
    """A kubernetes_asyncio ApiClient for the sandbox, closed after the test."""
    from kubernetes_asyncio import config

    client = await config.new_client_from_config(
        config_file=str(kube_config_path), persist_config=False
    )
    async with client:
        yield client
