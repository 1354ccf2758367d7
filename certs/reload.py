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
        with tempfile.TemporaryDirectory(prefix="arbiter-tls-") as scratch:
            cert_copy = Path(scratch, "tls.crt")
            key_copy = Path(scratch, "tls.key")
            cert_copy.write_bytes(cert)
            write_private(key_copy, key)
            try:
                _server_context().load_cert_chain(cert_copy, key_copy)
            except (ssl.SSLError, OSError, ValueError) as error:
                log.warning("new serving certificate not loaded (kept the old one)",
                            extra={"error": str(error)})
                return False
            self.context.load_cert_chain(cert_copy, key_copy)
        first = not self._digest
        self._digest = digest
        if not first:
            log.info("reloaded serving certificate", extra={"cert": str(self.cert_file)})
        return True
