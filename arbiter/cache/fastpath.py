"""A cached Job's fast-path token (arbiter.core.fastpath), checked the same
way by the validating webhook, the extender and the loop."""

from __future__ import annotations

from arbiter.cache.records import JobRecord
from arbiter.core.fastpath import (
    FAST_PATH_ANNOTATION,
    FastPathToken,
    demand_digest,
    fresh,
    verify,
)


def job_demand(job: JobRecord) -> str:
    """What a Job's token covers of its spec: pods at once, one pod's
    requests and the RuntimeClass whose overhead they get."""
    return demand_digest([(job.runtime_class or "", job.parallelism, job.pod_requests)])


def job_token(key: bytes | None, job: JobRecord) -> FastPathToken | None:
    """The token arbiter wrote on this Job at its creation: valid for its
    namespace, name and demand, and the Job created within the token's life
    (a Job created later under the same name never inherits one). None
    otherwise, or when there is no key."""
    text = dict(job.annotations).get(FAST_PATH_ANNOTATION)
    if text is None or key is None:
        return None
    token = verify(key, job.namespace, job.name, text, job_demand(job))
    if token is None or (job.created and not fresh(token, job.created)):
        return None
    return token
