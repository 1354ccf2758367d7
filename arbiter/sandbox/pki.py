"""The sandbox control plane's PKI: one CA, the apiserver's serving cert,
client certs per component, and the service-account signing key pair.

EC P-256 keys throughout: generating them takes microseconds (RSA 2048 takes
~100 ms each), and every component accepts them, including ES256 for
service-account tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=365)
# The first address of --service-cluster-ip-range: the `kubernetes` Service's ClusterIP.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)

# Client identities: file stem -> (common name = user, organizations = groups).
# kube-controller-manager and kube-scheduler use the users RBAC's bootstrap
# policy grants; kwok acts as every fake kubelet at once, so it gets admin.
CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("kubernetes-admin", ("system:masters",)),
    "kube-controller-manager": ("system:kube-controller-manager", ()),
    "kube-scheduler": ("system:kube-scheduler", ()),
    "kwok": ("kwok-controller", ("system:masters",)),
    # arbiter gets an identity of its own, so the webhook can tell its own
    # writes (e.g. unsuspending an admitted Job) from a user's.
    "kube-arbiter": ("kube-arbiter", ("system:masters",)),
}


@dataclass(frozen=True, slots=True)
class Pki:
    """Paths of everything in the sandbox's `pki/` directory."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"

    def client_cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def client_key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def complete(self) -> bool:
        needed = [self.ca_cert, self.ca_key, self.apiserver_cert, self.apiserver_key]
        needed += [self.sa_key, self.sa_pub]
        for name in CLIENTS:
            needed += [self.client_cert(name), self.client_key(name)]
        return all(path.is_file() for path in needed)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write(path: Path, data: bytes, private: bool) -> None:
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # Backdated a little so a clock a few seconds off never sees "not yet valid".
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A leaf certificate signed by the CA; the O attributes become Kubernetes groups."""
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        _builder(x509.Name(attributes), ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(ca=False), critical=True)
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


def create_pki(directory: Path) -> Pki:
    """Write a fresh CA and every certificate the control plane needs."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    ca_cert, ca_key = new_ca("kube-arbiter-sandbox-ca")
    _write(pki.ca_key, _key_pem(ca_key), private=True)
    _write(pki.ca_cert, _cert_pem(ca_cert), private=False)

    cert, key = issue(
        ca_cert,
        ca_key,
        "kube-apiserver",
        dns_names=APISERVER_DNS_NAMES,
        ip_addresses=("127.0.0.1", KUBERNETES_SERVICE_IP),
        server=True,
    )
    _write(pki.apiserver_key, _key_pem(key), private=True)
    _write(pki.apiserver_cert, _cert_pem(cert), private=False)

    for name, (user, groups) in CLIENTS.items():
        cert, key = issue(ca_cert, ca_key, user, organizations=groups, client=True)
        _write(pki.client_key(name), _key_pem(key), private=True)
        _write(pki.client_cert(name), _cert_pem(cert), private=False)

    sa_key = ec.generate_private_key(ec.SECP256R1())
    _write(pki.sa_key, _key_pem(sa_key), private=True)
    sa_pub = sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write(pki.sa_pub, sa_pub, private=False)
    return pki
