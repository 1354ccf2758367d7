"""The composition root (every surface, every named task), background
supervision and `arbiter serve` flags."""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import logging
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import arbiter.server.context as server
from arbiter.base import metrics
from arbiter.cache.store import KINDS, ClusterStore
from arbiter.cli.main import build_parser
from arbiter.cli.serve import JsonFormatter, config_from_args
from arbiter.loop.runtime import Leadership
from arbiter.server import app
from arbiter.server.app import build_app, build_extender_app, build_metrics_app
from arbiter.server.config import ServeConfig
from arbiter.server.context import ServerContext, sample_loop_lag


async def test_every_surface_is_served() -> None:
    ctx = ServerContext(config=ServeConfig(namespace="ns-x"), store=ClusterStore())
    async with TestClient(TestServer(build_app(ctx, background=False))) as client:
        assert (await client.get("/healthz")).status == 200
        assert (await client.get("/readyz")).status == 503  # nothing listed yet
        assert (await client.get("/metrics")).status == 200
        # The debug API is off by default, and never on the webhook port.
        assert (await client.get("/debug/queues")).status == 404
        # A bad review is a 400; the extender has a listener of its own.
        assert (await client.post("/webhook/validate/pods", data=b"x")).status == 400
        assert (await client.get("/webhook/nothing-here")).status == 404
        assert (await client.post("/scheduler/filter", data=b"{}")).status == 404
    async with TestClient(TestServer(build_metrics_app(ctx))) as client:
        assert (await client.get("/readyz")).status == 503
        assert (await client.get("/metrics")).status == 200
        assert (await client.get("/debug/queues")).status == 404  # off by default
    on = ServerContext(config=ServeConfig(debug_api="loopback"), store=ClusterStore())
    async with TestClient(TestServer(build_metrics_app(on), host="127.0.0.1")) as client:
        assert (await client.get("/debug/queues")).status == 200
    async with TestClient(TestServer(build_extender_app(ctx))) as client:
        assert (await client.get("/healthz")).status == 200
        # Not synced yet: the extender says so.
        assert (await client.post("/scheduler/filter", data=b"{}")).status == 503
        assert (await client.post("/webhook/validate/pods", data=b"x")).status == 404


def test_everything_that_runs_is_named() -> None:
    ctx = ServerContext(config=ServeConfig(), store=ClusterStore())
    tasks = app.background_tasks(ctx, Leadership())
    assert list(tasks) == ["cluster-watch", "certificates", "webhook-configurations",
                           "heap-freeze", "loop-lag", "declared-crds", "admission"]
    assert list(app.leader_tasks(ctx)) == ["jobflow-controller", "managed-namespace-labels"]


async def test_background_tasks_are_restarted_after_a_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    failures = 0
    started = asyncio.Event()

    async def flaky() -> None:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise RuntimeError("first run fails")
        started.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(server, "RESTART_BACKOFF", 0.01)
    application = web.Application()
    server.run_while_serving(application, {"flaky": flaky})
    async with TestClient(TestServer(application)):
        await asyncio.wait_for(started.wait(), 5)
        assert failures == 1  # restarted after the failure
    assert not any(task.get_name() == "flaky" for task in asyncio.all_tasks())


def test_serve_flags_default_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBITER_PORT", "10443")
    monkeypatch.setenv("ARBITER_WEBHOOK_URL", "https://127.0.0.1:10443")
    monkeypatch.setenv("ARBITER_EXCLUDED_NAMESPACES", "kube-system, infra")
    monkeypatch.setenv("ARBITER_NO_LEADER_ELECT", "true")
    argv = ["serve", "--overcommit", "1.5", "--username", "me"]
    config = config_from_args(build_parser(argv).parse_args(argv))
    assert config.port == 10443
    assert config.webhook_url == "https://127.0.0.1:10443"
    assert config.excluded_namespaces == ("kube-system", "infra")
    assert config.leader_elect is False
    assert config.overcommit == 1.5 and config.usernames == ("me",)
    assert config.managed_namespaces == "all"


def test_admission_at_creation_is_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def parsed(*flags: str) -> bool:
        argv = ["serve", *flags]
        return config_from_args(build_parser(argv).parse_args(argv)).admit_on_create

    assert parsed() is True
    assert parsed("--admit-on-create=false") is False
    assert parsed("--admit-on-create") is True
    monkeypatch.setenv("ARBITER_ADMIT_ON_CREATE", "false")
    assert parsed() is False
    assert parsed("--admit-on-create=true") is True


def test_managed_namespaces_flag_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBITER_MANAGED_NAMESPACES", "listed")
    argv = ["serve"]
    assert config_from_args(build_parser(argv).parse_args(argv)).managed_namespaces == "listed"
    argv = ["serve", "--managed-namespaces", "all"]
    assert config_from_args(build_parser(argv).parse_args(argv)).managed_namespaces == "all"
    monkeypatch.setenv("ARBITER_MANAGED_NAMESPACES", "some")
    argv = ["serve"]
    with pytest.raises(SystemExit, match="must be all or listed"):
        config_from_args(build_parser(argv).parse_args(argv))


@pytest.mark.parametrize(("argv", "message"), [
    (["--listener-handshake-timeout", "0"], "--listener-handshake-timeout: 0.0 must be greater"),
    (["--listener-max-connections", "0"], "--listener-max-connections: 0 must be greater"),
    (["--listener-idle-timeout", "inf"], "'inf' is not a finite number"),
    (["--overcommit", "nan"], "'nan' is not a finite number"),
    (["--reclaim-grace", "-1"], "--reclaim-grace: -1.0 must be at least 0"),
    (["--metrics-port", "65536"], "--metrics-port: 65536 must be at most 65535"),
    (["--max-body-bytes", "1e6"], "--max-body-bytes: '1e6' is not an integer"),
])
def test_a_number_out_of_range_is_refused_naming_the_flag(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A zero timeout or cap would leave connections open for good or refuse every
    one: the server does not start, and says which flag is wrong."""
    argv = ["serve", *argv]
    with pytest.raises(SystemExit):
        build_parser(argv).parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_number_variable_out_of_range_is_refused_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBITER_LISTENER_HEADER_TIMEOUT", "0")
    argv = ["serve"]
    with pytest.raises(SystemExit, match=r"ARBITER_LISTENER_HEADER_TIMEOUT: 0\.0 must be greater"):
        build_parser(argv)
    monkeypatch.setenv("ARBITER_LISTENER_HEADER_TIMEOUT", "")
    monkeypatch.setenv("ARBITER_RECLAIM_PDB_TIMEOUT", "-1")  # negative: never delete
    assert config_from_args(build_parser(argv).parse_args(argv)).reclaim_pdb_timeout == -1


def test_json_log_lines_carry_extra_fields() -> None:
    record = logging.LogRecord("arbiter.test", logging.WARNING, __file__, 1, "watch failed %s",
                               ("now",), None)
    record.kind = "Pod"
    line = JsonFormatter().format(record)
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["level"] == "warning" and entry["logger"] == "arbiter.test"
    assert entry["msg"] == "watch failed now" and entry["kind"] == "Pod"
    assert entry["ts"].endswith("Z")


async def test_heap_is_frozen_once_after_the_first_cache_sync(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(server, "_heap_frozen", False)
    def collect(*_: object) -> int:
        calls.append("collect")
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    store = ClusterStore()
    ctx = ServerContext(config=ServeConfig(), store=store)
    registered = app.background_tasks(ctx, Leadership())["heap-freeze"]
    assert isinstance(registered, functools.partial)
    assert registered.func is server.freeze_after_first_sync
    task = asyncio.create_task(server.freeze_after_first_sync(ctx, poll=0.001))
    await asyncio.sleep(0.02)
    assert calls == [] and not task.done()  # nothing listed yet: nothing frozen
    store.synced_kinds.update(KINDS)
    await asyncio.wait_for(task, 5)
    assert calls == ["collect", "freeze"]  # garbage collected first, then frozen
    # Another server in the same process (or a restarted task): not again.
    await server.freeze_after_first_sync(ServerContext(config=ServeConfig(), store=store))
    assert calls == ["collect", "freeze"]


async def test_loop_lag_is_observed_when_the_loop_is_held() -> None:
    def observed() -> float:
        value = metrics.REGISTRY.get_sample_value("arbiter_event_loop_lag_seconds_count")
        return value or 0.0

    def held_over_100ms() -> float:
        value = metrics.REGISTRY.get_sample_value(
            "arbiter_event_loop_lag_seconds_bucket", {"le": "0.1"})
        return observed() - (value or 0.0)

    before, late_before = observed(), held_over_100ms()
    sampler = asyncio.create_task(sample_loop_lag(interval=0.01))
    await asyncio.sleep(0.05)
    time.sleep(0.3)  # noqa: ASYNC251 (a handler that blocks the loop)
    await asyncio.sleep(0.05)
    sampler.cancel()
    assert observed() > before
    assert held_over_100ms() >= late_before + 1  # the timer it held
