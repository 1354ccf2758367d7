"""Serving certificates for arbiter's webhook and extender endpoints.

`authority` makes the CA and serving certificate, `reload` serves them
through an SSLContext that is replaced in place, `manager` runs the life
cycle (Secret storage, rotation, external certificates) and `publish`
keeps the webhook configurations' caBundle current.
"""

from certs.authority import (
    CertificatePaths,
    ensure_serving_certificate,
    needs_renewal,
)

__all__ = ["CertificatePaths", "ensure_serving_certificate", "needs_renewal"]
