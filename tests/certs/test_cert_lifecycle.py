"""Serving certificates: hot reload without dropped requests, rotation,
external certificates, Secret storage and caBundle publishing."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import shutil
import ssl
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509

import certs.authority as authority
from arbiter.cache.store import ClusterStore
from arbiter.server.config import ServeConfig
from arbiter.server.context import ServerContext, maintain_certificates, serving_names
from certs.authority import ensure_serving_certificate, paths_in
from certs.manager import CertManager
from certs.publish import publish_ca_bundle
from certs.reload import ReloadingTLS
from tests.fakes.fake_api import FakeApi
from webhook.configuration import MUTATING_PATH, VALIDATING_PATH, desired_configurations, install

NAMES = (["kube-arbiter.arbiter-system.svc", "localhost"], ["127.0.0.1"])


def _serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


async def _peer_serial(port: int, ca_file: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca_file))
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        await writer.wait_closed()


def _force_renewal(directory: Path) -> None:
    """Re-issue the serving certificate as if 300 days had passed."""
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=300)
    ensure_serving_certificate(directory, *NAMES, now=later)


async def test_reload_serves_new_certificate_without_dropping_requests(tmp_path: Path) -> None:
    paths = ensure_serving_certificate(tmp_path, *NAMES)
    tls = ReloadingTLS(paths.cert_file, paths.key_file)
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
    await site.start()
    port = runner.addresses[0][1]
    client_tls = ssl.create_default_context(cafile=str(paths.ca_file))
    try:
        before = await _peer_serial(port, paths.ca_file)
        assert before == _serial(paths.cert_file.read_bytes())
        statuses: list[int] = []
        stop = asyncio.Event()

        async def hammer(session: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                async with session.get(f"https://127.0.0.1:{port}/", ssl=client_tls) as answer:
                    statuses.append(answer.status)

        async with aiohttp.ClientSession() as keep_alive, aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True)) as fresh:
            workers = [asyncio.create_task(hammer(keep_alive)),
                       asyncio.create_task(hammer(fresh))]
            await asyncio.sleep(0.2)
            _force_renewal(tmp_path)
            assert tls.reload() is True
            await asyncio.sleep(0.2)
            stop.set()
            await asyncio.gather(*workers)
        assert statuses and set(statuses) == {200}
        after = await _peer_serial(port, paths.ca_file)
        assert after != before and after == _serial(paths.cert_file.read_bytes())
        assert tls.reload() is False  # unchanged files: nothing to do
    finally:
        await runner.cleanup()


def test_half_written_pair_keeps_the_old_certificate(tmp_path: Path) -> None:
    paths = ensure_serving_certificate(tmp_path, *NAMES)
    tls = ReloadingTLS(paths.cert_file, paths.key_file)
    digest = tls.digest
    paths.key_file.write_bytes(paths.key_file.read_bytes()[:40])
    assert tls.reload() is False
    assert tls.digest == digest


async def test_manager_rotates_in_the_last_third_and_keeps_the_ca(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = CertManager(tmp_path, *NAMES)
    tls = await manager.prepare()
    first_digest, ca = tls.digest, manager.ca_pem
    assert ca and not manager.external
    assert await manager.refresh() is False and tls.digest == first_digest
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=300)
    monkeypatch.setattr(authority, "_now", lambda: later)
    assert await manager.refresh() is False  # same CA: no caBundle change
    assert tls.digest != first_digest
    assert manager.ca_pem == ca


async def test_external_certificates_are_used_as_is_and_reloaded(tmp_path: Path) -> None:
    issuer = tmp_path / "issuer"
    paths = ensure_serving_certificate(issuer, *NAMES)
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for name in ("ca.crt", "tls.crt", "tls.key"):
        shutil.copy(issuer / name, mounted / name)
    manager = CertManager(mounted, *NAMES)
    tls = await manager.prepare()
    assert manager.external and not (mounted / "ca.key").exists()
    assert (mounted / "tls.crt").read_bytes() == paths.cert_file.read_bytes()
    # cert-manager renews with a new CA: files swapped, CA change reported.
    other = ensure_serving_certificate(tmp_path / "other", *NAMES)
    for name in ("ca.crt", "tls.key", "tls.crt"):
        shutil.copy(tmp_path / "other" / name, mounted / name)
    digest = tls.digest
    assert await manager.refresh() is True
    assert tls.digest != digest
    assert manager.ca_pem == other.ca_file.read_bytes()


async def test_secret_storage_shares_one_ca_between_replicas(tmp_path: Path) -> None:
    api = FakeApi()
    first = CertManager(tmp_path / "a", *NAMES, api=api, secret=("arbiter-system", "certs"))
    await first.prepare()
    stored = api.objects["/api/v1/namespaces/arbiter-system/secrets/certs"]
    assert stored["type"] == "kubernetes.io/tls"
    assert set(stored["data"]) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    second = CertManager(tmp_path / "b", *NAMES, api=api, secret=("arbiter-system", "certs"))
    await second.prepare()
    assert second.ca_pem == first.ca_pem
    assert paths_in(tmp_path / "b").cert_file.read_bytes() == \
        paths_in(tmp_path / "a").cert_file.read_bytes()


async def test_existing_directory_files_create_the_missing_secret(tmp_path: Path) -> None:
    """A restarted replica (files on disk, Secret absent) stores its files in the Secret."""
    api = FakeApi()
    secret_path = "/api/v1/namespaces/arbiter-system/secrets/certs"
    existing = ensure_serving_certificate(tmp_path / "a", *NAMES)
    ca = existing.ca_file.read_bytes()
    first = CertManager(tmp_path / "a", *NAMES, api=api, secret=("arbiter-system", "certs"))
    await first.prepare()
    assert first.ca_pem == ca  # the directory's CA is kept...
    stored = api.objects[secret_path]  # ...and now lives in the Secret
    assert base64.b64decode(stored["data"]["ca.crt"]) == ca
    assert set(stored["data"]) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    second = CertManager(tmp_path / "b", *NAMES, api=api, secret=("arbiter-system", "certs"))
    await second.prepare()
    assert second.ca_pem == ca
    # The Secret deleted later: the next check stores the files again.
    del api.objects[secret_path]
    assert await first.refresh() is False
    assert base64.b64decode(api.objects[secret_path]["data"]["ca.crt"]) == ca


async def test_secret_overrides_stale_directory_files(tmp_path: Path) -> None:
    """Once the Secret exists it is the source of truth, even over files on disk."""
    api = FakeApi()
    owner = CertManager(tmp_path / "a", *NAMES, api=api, secret=("arbiter-system", "certs"))
    await owner.prepare()
    ensure_serving_certificate(tmp_path / "b", *NAMES)  # a different, local CA
    other = CertManager(tmp_path / "b", *NAMES, api=api, secret=("arbiter-system", "certs"))
    await other.prepare()
    assert other.ca_pem == owner.ca_pem
    assert [call for call in api.calls if call[0] != "GET"] == [
        ("POST", "/api/v1/namespaces/arbiter-system/secrets")]


async def test_install_then_publish_ca_bundle(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every log call's extra fields are valid
    api = FakeApi()
    mutating, validating = desired_configurations(url="https://127.0.0.1:9443",
                                                  ca_bundle=b"old-ca", excluded_namespaces=())
    await install(api, mutating, validating)
    await install(api, mutating, validating)  # idempotent: replaces
    assert await publish_ca_bundle(api, b"new-ca") == 2
    for path in (MUTATING_PATH, VALIDATING_PATH):
        stored = api.objects[f"{path}/kube-arbiter"]
        bundles = {hook["clientConfig"]["caBundle"] for hook in stored["webhooks"]}
        assert bundles == {"bmV3LWNh"}  # base64("new-ca")
    assert await publish_ca_bundle(api, b"new-ca") == 0
    assert any("created webhook configuration" in r.getMessage() for r in caplog.records)


def test_serving_names_cover_service_and_webhook_url() -> None:
    dns, ips = serving_names(ServeConfig(namespace="ns", webhook_url="https://10.0.0.5:9443"))
    assert "kube-arbiter.ns.svc" in dns and "kube-arbiter.ns.svc.cluster.local" in dns
    assert ips == ["127.0.0.1", "10.0.0.5"]


async def test_server_publishes_ca_into_manifest_installed_configurations(
        tmp_path: Path) -> None:
    api = FakeApi()
    mutating, validating = desired_configurations(service=("arbiter-system", "kube-arbiter"),
                                                  excluded_namespaces=())
    await install(api, mutating, validating)
    certs = CertManager(tmp_path, *NAMES)
    await certs.prepare()
    ctx = ServerContext(config=ServeConfig(cert_check_interval=3600), store=ClusterStore(),
                        api=api, certs=certs)
    task = asyncio.create_task(maintain_certificates(ctx))
    try:
        stored = api.objects[f"{VALIDATING_PATH}/kube-arbiter"]
        for _ in range(100):
            if "caBundle" in stored["webhooks"][0]["clientConfig"]:
                break
            await asyncio.sleep(0.01)
            stored = api.objects[f"{VALIDATING_PATH}/kube-arbiter"]
        bundle = stored["webhooks"][0]["clientConfig"]["caBundle"]
        assert base64.b64decode(bundle) == certs.ca_pem
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
