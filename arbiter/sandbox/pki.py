"""The sandbox control plane's PKI: one CA, the apiserver's serving cert,
client certs per component, and the service-account signing key pair,
all issued with arbiter's one PKI module (`certs.authority`).

EC P-256 keys throughout: generating them takes microseconds (RSA 2048 takes
~100 ms each), and every component accepts them, including ES256 for
service-account tokens.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certs.authority import cert_pem, issue, key_pem, new_ca, write_private, write_public

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
    # The integration controllers (`integrations`), by integration name:
    # masters, as upstream's ClusterRoles grant them nearly as much.
    "jobset": ("jobset-controller", ("system:masters",)),
    "lws": ("lws-controller", ("system:masters",)),
    "ray": ("kuberay-operator", ("system:masters",)),
    "trainer": ("kubeflow-trainer-controller-manager", ("system:masters",)),
}


# One typed property per path: callers get a name, not a string to join.
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


def issue_serving(keys: Pki, directory: Path, common_name: str) -> Path:
    """A serving certificate for 127.0.0.1 signed by the sandbox's CA, as
    `directory`/tls.crt and tls.key (the names controller-runtime reads);
    returns the CA file that verifies it."""
    ca_cert = x509.load_pem_x509_certificate(keys.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(keys.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{keys.ca_key}: expected an EC private key")
    cert, key = issue(ca_cert, ca_key, common_name, dns_names=("localhost",),
                      ip_addresses=("127.0.0.1",), server=True, validity=VALIDITY)
    directory.mkdir(parents=True, exist_ok=True)
    write_private(directory / "tls.key", key_pem(key))
    write_public(directory / "tls.crt", cert_pem(cert))
    return keys.ca_cert


def create_pki(directory: Path) -> Pki:
    """Write a fresh CA and every certificate the control plane needs."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    ca_cert, ca_key = new_ca("kube-arbiter-sandbox-ca", validity=VALIDITY)
    write_private(pki.ca_key, key_pem(ca_key))
    write_public(pki.ca_cert, cert_pem(ca_cert))

    cert, key = issue(ca_cert, ca_key, "kube-apiserver", dns_names=APISERVER_DNS_NAMES,
                      ip_addresses=("127.0.0.1", KUBERNETES_SERVICE_IP), server=True,
                      validity=VALIDITY)
    write_private(pki.apiserver_key, key_pem(key))
    write_public(pki.apiserver_cert, cert_pem(cert))

    for name, (user, groups) in CLIENTS.items():
        cert, key = issue(ca_cert, ca_key, user, organizations=groups, client=True,
                          validity=VALIDITY)
        write_private(pki.client_key(name), key_pem(key))
        write_public(pki.client_cert(name), cert_pem(cert))

    sa_key = ec.generate_private_key(ec.SECP256R1())
    write_private(pki.sa_key, key_pem(sa_key))
    write_public(pki.sa_pub, sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki
