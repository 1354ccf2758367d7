"""Serving certificates over the server's life: create, share, rotate, reload.

- Self-managed (the default): a CA and serving certificate in the
  certificate directory, made on first start, renewed in the last third of
  the serving certificate's life (about four months before expiry for the
  one-year certificate) and reloaded without dropping requests.
- With a Secret: the directory mirrors the Secret, so every replica and
  every restart uses the same CA and caBundle.
- Provided from outside (cert-manager style: `tls.crt`/`tls.key`, optional
  `ca.crt`, no `ca.key` in a mounted directory): used as is and reloaded
  when the files change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbiter.base.kubeapi import ApiError
from certs import secret as secret_store
from certs.authority import CertificatePaths, ensure_serving_certificate, paths_in
from certs.reload import ReloadingTLS

log = logging.getLogger(__name__)

OnCaChange = Callable[[bytes], Awaitable[None]]


@dataclass(slots=True)
class CertManager:
    directory: Path
    dns_names: list[str]
    ip_addresses: list[str]
    api: Any | None = None
    # (namespace, name) of the Secret that stores the certificates, if any.
    secret: tuple[str, str] | None = None
    tls: ReloadingTLS | None = None
    ca_pem: bytes = b""
    _secret_version: str | None = field(default=None)
    _stored: dict[str, bytes] = field(default_factory=dict)

    @property
    def paths(self) -> CertificatePaths:
        return paths_in(self.directory)

    @property
    def external(self) -> bool:
        paths = self.paths
        return (paths.cert_file.exists() and paths.key_file.exists()
                and not paths.ca_key_file.exists())

    async def _sync_from_secret(self) -> None:
        if self.secret is None or self.api is None:
            return
        namespace, name = self.secret
        # `_stored` is what the Secret holds (nothing when it is missing), so
        # files already in the directory -- a restart, a mounted emptyDir, a
        # deleted Secret -- are stored by `_sync_to_secret` rather than being
        # mistaken for the Secret's content.
        self._secret_version, self._stored = await secret_store.load(
            self.api, namespace, name, self.directory)

    async def _sync_to_secret(self) -> None:
        if self.secret is None or self.api is None or self.external:
            return
        if secret_store.read_files(self.paths) == self._stored:
            return
        namespace, name = self.secret
        try:
            self._secret_version = await secret_store.store(
                self.api, namespace, name, self.paths, self._secret_version)
            self._stored = secret_store.read_files(self.paths)
        except ApiError as error:
            if error.status != 409:
                raise
            # Another replica stored first: take its certificates next time.
            log.info("certificate Secret changed concurrently; will reload it")

    def _ensure(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.external:
            ensure_serving_certificate(self.directory, self.dns_names, self.ip_addresses)

    def _read_ca(self) -> bytes:
        try:
            return self.paths.ca_file.read_bytes()
        except OSError:
            return b""

    def shared_secret(self) -> bytes | None:
        """A secret every replica holds (the CA key, else the serving key:
        both come from the certificate Secret): the fast path's token key
        is derived from it (arbiter.core.fastpath). None when unreadable."""
        for path in (self.paths.ca_key_file, self.paths.key_file):
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if data:
                return data
        return None

    async def prepare(self) -> ReloadingTLS:
        """Make sure a usable certificate exists and load it."""
        await self._sync_from_secret()
        self._ensure()
        await self._sync_to_secret()
        self.tls = ReloadingTLS(self.paths.cert_file, self.paths.key_file)
        self.ca_pem = self._read_ca()
        return self.tls

    async def refresh(self) -> bool:
        """One check: renew or pick up new files, reload; True if the CA changed."""
        await self._sync_from_secret()
        self._ensure()
        await self._sync_to_secret()
        if self.tls is not None:
            self.tls.reload()
        ca = self._read_ca()
        changed = ca != self.ca_pem
        self.ca_pem = ca
        return changed

    async def run(self, interval: float, on_ca_change: OnCaChange | None = None) -> None:
        """Check every `interval` seconds until cancelled; publish a new CA."""
        while True:
            await asyncio.sleep(interval)
            try:
                changed = await self.refresh()
                if changed and on_ca_change is not None and self.ca_pem:
                    await on_ca_change(self.ca_pem)
            except (ApiError, OSError, ValueError) as error:
                log.warning("certificate check failed", extra={"error": str(error)})
            except Exception:  # keep serving with the current certificate
                log.exception("certificate check failed")
