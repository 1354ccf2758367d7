"""A TLS server context whose certificate can be replaced while serving.

The listening socket keeps one `ssl.SSLContext`; `reload()` loads the new
pair into it. OpenSSL copies the certificate into each connection when the
connection is created, so connections already open keep working and every
new handshake gets the new certificate: no request is dropped.

A pair is first read into memory and validated in a scratch context, then
loaded from private copies of exactly those bytes, so a half-written file
(a rotation in progress, a kubelet Secret-volume swap) is never loaded: the
old certificate simply stays until the next check.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import tempfile
from pathlib import Path

from certs.authority import write_private

log = logging.getLogger(__name__)


def _server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context


class ReloadingTLS:
    """The server-side SSLContext for `cert_file` / `key_file`, hot-reloadable."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = _server_context()
        # Further contexts serving the same pair (e.g. one requiring client
        # certificates), reloaded with it.
        self._derived: list[ssl.SSLContext] = []
        self._pair: tuple[bytes, bytes] | None = None
        self._digest = ""
        if not self.reload():
            raise ssl.SSLError(f"cannot load {cert_file} / {key_file}")

    @property
    def digest(self) -> str:
        """SHA-256 of the certificate being served (changes on every reload)."""
        return self._digest

    def _read(self) -> tuple[bytes, bytes] | None:
        try:
            return self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as error:
            log.warning("cannot read serving certificate", extra={"error": str(error)})
            return None

    def reload(self) -> bool:
        """Load the files if they changed and form a valid pair; True if loaded."""
        pair = self._read()
        if pair is None:
            return False
        cert, key = pair
        digest = hashlib.sha256(cert + b"\0" + key).hexdigest()
        if digest == self._digest:
            return False
        try:
            _load_pair([_server_context()], cert, key)  # validated first
        except (ssl.SSLError, OSError, ValueError) as error:
            log.warning("new serving certificate not loaded (kept the old one)",
                        extra={"error": str(error)})
            return False
        _load_pair([self.context, *self._derived], cert, key)
        self._pair = pair
        first = not self._digest
        self._digest = digest
        if not first:
            log.info("reloaded serving certificate", extra={"cert": str(self.cert_file)})
        return True

    def requiring_clients_of(self, client_ca: Path) -> ssl.SSLContext:
        """A context serving the same certificate (reloaded with it) that
        completes a handshake only with a client certificate `client_ca`
        signed."""
        context = _server_context()
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=str(client_ca))
        assert self._pair is not None  # loaded in __init__
        _load_pair([context], *self._pair)
        self._derived.append(context)
        return context


def _load_pair(contexts: list[ssl.SSLContext], cert: bytes, key: bytes) -> None:
    """Load the pair into `contexts` from private copies of exactly these bytes."""
    with tempfile.TemporaryDirectory(prefix="arbiter-tls-") as scratch:
        cert_copy, key_copy = Path(scratch, "tls.crt"), Path(scratch, "tls.key")
        cert_copy.write_bytes(cert)
        write_private(key_copy, key)
        for context in contexts:
            context.load_cert_chain(cert_copy, key_copy)
