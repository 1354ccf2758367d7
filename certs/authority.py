"""arbiter's one PKI: a small self-signed CA and certificates signed by it.

`ensure_serving_certificate` keeps the webhook's serving certificate; the
sandbox issues its control plane's certificates with `new_ca` and `issue`.

Files in the certificate directory: `ca.crt`, `ca.key`, `tls.crt`, `tls.key`
(the names cert-manager and kubernetes.io/tls Secrets use). When the CA key
is absent the directory is treated as provided from outside and never
rewritten.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = dt.timedelta(days=3650)
SERVING_VALIDITY = dt.timedelta(days=365)
# A certificate and its private key.
Issued = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
# Renew when less than this fraction of the serving certificate's life is left.
RENEW_FRACTION = 1 / 3


@dataclass(frozen=True, slots=True)
class CertificatePaths:
    ca_file: Path
    cert_file: Path
    key_file: Path
    ca_key_file: Path


def paths_in(directory: Path) -> CertificatePaths:
    return CertificatePaths(
        ca_file=directory / "ca.crt",
        cert_file=directory / "tls.crt",
        key_file=directory / "tls.key",
        ca_key_file=directory / "ca.key",
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def write_private(path: Path, data: bytes) -> None:
    """Write atomically with 0600 permissions, so a reader never sees half a key."""
    _write(path, data, 0o600)


def write_public(path: Path, data: bytes) -> None:
    """Write a certificate (or public key) atomically, readable by all (0644)."""
    _write(path, data, 0o644)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, key_cert_sign=ca, crl_sign=ca,
        content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, encipher_only=False, decipher_only=False,
    )


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             validity: dt.timedelta) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # Backdated a little so a clock a few seconds off never sees "not yet valid".
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + validity)
    )


def new_ca(common_name: str, *, validity: dt.timedelta = CA_VALIDITY) -> Issued:
    """A self-signed CA that signs leaf certificates only (EC P-256 keys
    throughout: microseconds to generate, accepted by every component)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key, validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    *,
    organizations: Sequence[str] = (),
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    server: bool = False,
    client: bool = False,
    validity: dt.timedelta = SERVING_VALIDITY,
) -> Issued:
    """A leaf certificate signed by the CA, for serving and/or client
    authentication; the O attributes become Kubernetes groups."""
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    builder = (
        _builder(x509.Name(attributes), ca_cert.subject, key, validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if dns_names or ip_addresses:
        sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def needs_renewal(cert_file: Path, now: dt.datetime | None = None) -> bool:
    """True when the certificate is missing, unreadable or in its last third of life."""
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError):
        return True
    moment = now or _now()
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - moment < lifetime * RENEW_FRACTION


def _sans_cover(cert_file: Path, dns_names: list[str], ip_addresses: list[str]) -> bool:
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have_dns = set(san.get_values_for_type(x509.DNSName))
    have_ip = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    want_ip = {str(ipaddress.ip_address(ip)) for ip in ip_addresses}
    return set(dns_names) <= have_dns and want_ip <= have_ip


def ensure_serving_certificate(
    directory: Path,
    dns_names: list[str],
    ip_addresses: list[str],
    *,
    now: dt.datetime | None = None,
) -> CertificatePaths:
    """Make sure `directory` holds a valid CA and serving certificate.

    Creates the CA on first use (kept afterwards, so the caBundle stays
    stable) and (re)issues the serving certificate when it is missing, does
    not cover the requested names, or is in its last third of validity.
    Certificates mounted from outside (no `ca.key`) are used as they are.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = paths_in(directory)
    externally_managed = (
        paths.cert_file.exists() and paths.key_file.exists() and not paths.ca_key_file.exists()
    )
    if externally_managed:
        return paths
    if paths.ca_file.exists() and paths.ca_key_file.exists():
        ca_cert = x509.load_pem_x509_certificate(paths.ca_file.read_bytes())
        loaded = serialization.load_pem_private_key(paths.ca_key_file.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{paths.ca_key_file}: expected an EC private key")
        ca_key = loaded
    else:
        ca_cert, ca_key = new_ca("kube-arbiter-ca")
        write_private(paths.ca_key_file, key_pem(ca_key))
        write_private(paths.ca_file, cert_pem(ca_cert))
    fresh = (
        paths.cert_file.exists()
        and paths.key_file.exists()
        and not needs_renewal(paths.cert_file, now)
        and _sans_cover(paths.cert_file, dns_names, ip_addresses)
    )
    if not fresh:
        common_name = dns_names[0] if dns_names else (
            ip_addresses[0] if ip_addresses else "arbiter")
        cert, key = issue(ca_cert, ca_key, common_name, dns_names=dns_names,
                          ip_addresses=ip_addresses, server=True)
        # Key first, then certificate: a reloader keyed on the cert file's
        # change then always finds a matching key.
        write_private(paths.key_file, key_pem(key))
        write_private(paths.cert_file, cert_pem(cert))
    return paths
