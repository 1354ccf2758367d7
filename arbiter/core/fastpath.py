"""The token of a Job admitted at creation (DESIGN §16, the fast path).

The leader's mutating webhook lets a Job through unsuspended when its
queue would admit it as the engine's next decision, and writes this token
into the Job's `arbiter.dev/admitted-on-create` annotation. Who may trust
it: the validating webhook (an unsuspended Job from a tenant passes only
with a valid one), the extender (pods of such a Job before its unit is
seen), and a new leader (a Job the old one let through, whose unit it did
not write yet, is adopted as admitted).

A tenant can write any annotation, so the token is an HMAC (SHA-256) over
what it admits: namespace, Job name, unit name, queue, pool, the time it
was issued and the Job's pod sets (counts and requests). The key is
derived from the CA key every replica shares (the certificate Secret), so
any replica can check a token and no tenant can make one. The uid is not
covered: the apiserver assigns it after the mutating webhooks ran. A token
is tied to one creation instead: it counts only for a Job created within
`TOKEN_TTL` of its issue. Within that window a copy of a genuine token on
a Job of the same namespace, name and demand (the first one deleted) would
pass too: that Job runs once more, charged to the same queue.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

FAST_PATH_ANNOTATION = "arbiter.dev/admitted-on-create"
# Seconds a token stays good for a Job's creation: the webhook's answer to
# the object stored (other webhooks, the apiserver's timeouts: 10 s at most).
TOKEN_TTL = 30.0
_VERSION = "v1"
_SEP = ";"
_MAC_HEX = 32  # 128 bits of the SHA-256 MAC
_MAX_TOKEN = 1024


@dataclass(frozen=True, slots=True)
class FastPathToken:
    unit: str  # the unit's name (namespace: the Job's)
    queue: str
    pool: str  # "" when admitted without a plan
    issued_ms: int  # unix milliseconds

    @property
    def issued(self) -> float:
        return self.issued_ms / 1000.0


def derive_key(secret: bytes) -> bytes:
    """The token key, from a secret every replica shares (the CA key)."""
    return hashlib.sha256(b"kube-arbiter admit-on-create v1\0" + secret).digest()


def demand_digest(pod_sets: Iterable[tuple[str, int, Mapping[str, int]]]) -> str:
    """Canonical text of pod sets (name, count, requests) a token covers."""
    parts = []
    for name, count, requests in pod_sets:
        asked = ",".join(f"{k}={v}" for k, v in sorted(requests.items()))
        parts.append(f"{name}:{count}:{asked}")
    return "|".join(parts)


def _mac(key: bytes, namespace: str, job: str, token: FastPathToken, demand: str) -> str:
    message = "\0".join((_VERSION, namespace, job, token.unit, token.queue, token.pool,
                         str(token.issued_ms), demand)).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:_MAC_HEX]


def sign(key: bytes, namespace: str, job: str, token: FastPathToken, demand: str) -> str:
    """The annotation's value."""
    return _SEP.join((_VERSION, token.unit, token.queue, token.pool, str(token.issued_ms),
                      _mac(key, namespace, job, token, demand)))


def parse(text: object) -> tuple[FastPathToken, str] | None:
    """The token and its MAC as written, None when it is not one."""
    if not isinstance(text, str) or len(text) > _MAX_TOKEN:
        return None
    parts = text.split(_SEP)
    if len(parts) != 6 or parts[0] != _VERSION:
        return None
    _, unit, queue, pool, issued, mac = parts
    if not (issued.isascii() and issued.isdigit() and len(issued) <= 15) or not unit or not queue:
        return None
    return FastPathToken(unit, queue, pool, int(issued)), mac


def verify(key: bytes | None, namespace: str, job: str, text: object,
           demand: str) -> FastPathToken | None:
    """The token `text` when arbiter made it for this Job and demand; else None."""
    if not key:
        return None
    parsed = parse(text)
    if parsed is None:
        return None
    token, mac = parsed
    if not hmac.compare_digest(mac, _mac(key, namespace, job, token, demand)):
        return None
    return token


def fresh(token: FastPathToken, at: float, ttl: float = TOKEN_TTL) -> bool:
    """Whether `at` (a Job's creation, or now) lies within the token's life.
    A second of slack before: creationTimestamp has whole seconds."""
    return token.issued - 1.0 <= at <= token.issued + ttl
