"""The listeners `arbiter serve` opens: the webhook port, and the extender on
a port of its own that requires a client certificate (DESIGN §13)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from arbiter.cache.store import ClusterStore
from arbiter.server.app import start_listeners
from arbiter.server.config import ServeConfig
from arbiter.server.context import ServerContext
from certs.authority import cert_pem, issue, key_pem, new_ca, write_private, write_public
from certs.manager import CertManager


def _client_pair(directory: Path, ca_name: str,
                 names: tuple[str, ...] = ("system:kube-scheduler",)) -> list[Path]:
    """A CA (its file) and, per name, a client certificate and key it signed."""
    ca_cert, ca_key = new_ca(ca_name)
    paths = [directory / f"{ca_name}.crt"]
    write_public(paths[0], cert_pem(ca_cert))
    for index, name in enumerate(names):
        cert, key = issue(ca_cert, ca_key, name, client=True)
        paths += [directory / f"{ca_name}-{index}.crt", directory / f"{ca_name}-{index}.key"]
        write_public(paths[-2], cert_pem(cert))
        write_private(paths[-1], key_pem(key))
    return paths


async def _listeners(tmp_path: Path, client_ca: Path | None,
                     names: tuple[str, ...] = ("system:kube-scheduler",),
                     ) -> AsyncIterator[dict[str, int]]:
    config = ServeConfig(host="127.0.0.1", port=0, extender_port=0, metrics_port=0,
                         cert_dir=tmp_path / "serving", extender_client_ca=client_ca,
                         extender_client_names=names)
    certs = CertManager(config.cert_dir, ["localhost"], ["127.0.0.1"])
    ctx = ServerContext(config=config, store=ClusterStore(), certs=certs)
    runners = await start_listeners(ctx, await certs.prepare(), background=False)
    try:
        yield {name: runner.addresses[0][1] for name, runner in runners.items()}
    finally:
        for runner in runners.values():
            await runner.cleanup()


def _context(tmp_path: Path, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(tmp_path / "serving" / "ca.crt"))
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


async def _filter(port: int, context: ssl.SSLContext) -> int | str:
    """The status of a forged filter call, or the error that ended it."""
    try:
        async with aiohttp.ClientSession() as session, session.post(
                f"https://127.0.0.1:{port}/scheduler/filter", data=b"{}", ssl=context) as answer:
            return answer.status
    except (aiohttp.ClientError, ssl.SSLError, ConnectionError) as error:
        return type(error).__name__


async def test_the_extender_requires_a_client_certificate_of_the_configured_ca(
        tmp_path: Path) -> None:
    ca, cert, key = _client_pair(tmp_path, "scheduler-clients")
    _, rogue_cert, rogue_key = _client_pair(tmp_path, "rogue")
    async for ports in _listeners(tmp_path, ca):
        assert set(ports) == {"webhook", "extender", "metrics"}
        assert len(set(ports.values())) == 3
        # kube-scheduler's certificate gets through (503: the cache has not synced).
        assert await _filter(ports["extender"], _context(tmp_path, (cert, key))) == 503
        # A forged call without a certificate, or with one of another CA, is refused.
        for refused in (None, (rogue_cert, rogue_key)):
            status = await _filter(ports["extender"], _context(tmp_path, refused))
            assert isinstance(status, str) or 400 <= status < 500, status
        # The webhook port does not serve the extender at all.
        assert await _filter(ports["webhook"], _context(tmp_path, None)) == 404


async def test_the_extender_answers_only_the_allowed_client_names(tmp_path: Path) -> None:
    # The cluster CA signs kubelets' and users' certificates too: one of them
    # must not be able to hold a queue's capacity with forged filter calls.
    ca, scheduler_cert, scheduler_key, node_cert, node_key = _client_pair(
        tmp_path, "cluster", ("system:kube-scheduler", "system:node:worker-1"))
    async for ports in _listeners(tmp_path, ca):
        assert await _filter(ports["extender"],
                             _context(tmp_path, (scheduler_cert, scheduler_key))) == 503
        assert await _filter(ports["extender"], _context(tmp_path, (node_cert, node_key))) == 403
    # An empty list: any certificate of the CA (the admin's explicit choice).
    async for ports in _listeners(tmp_path, ca, names=()):
        assert await _filter(ports["extender"], _context(tmp_path, (node_cert, node_key))) == 503


async def test_without_a_client_ca_the_extender_warns_and_still_serves(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        async for ports in _listeners(tmp_path, None):
            assert await _filter(ports["extender"], _context(tmp_path, None)) == 503
    assert any("--extender-client-ca" in record.getMessage() for record in caplog.records)

