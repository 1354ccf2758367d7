"""Serving certificates for arbiter's webhook and extender endpoints."""

from certs.authority import (
    CertificatePaths,
    ensure_serving_certificate,
    needs_renewal,
)

__all__ = ["CertificatePaths", "ensure_serving_certificate", "needs_renewal"]
