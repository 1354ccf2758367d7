"""AdmissionReview handling: decide, build JSONPatch, answer.

One module per reviewed kind (`pods`, `jobs`, `queues`, `queueunits`;
`workloads` for every optional integration's kind, read from its
`arbiter.integrations` descriptor), each with pure `mutate`/`validate`
functions of a parsed `AdmissionRequest` and an `AdmissionEnv` (the
in-memory cache and arbiter's identity). `review`
holds the wire types, `patch` the JSON Patch helpers, `endpoints` the table
of paths and the hooks that reach them, `http` the thin aiohttp adapter (a
sub-application) and `configuration` the webhook configurations derived
from the table. No Kubernetes API call in a request path.
"""

from webhook.endpoints import BY_PATH, ENDPOINTS, Endpoint
from webhook.review import (
    AdmissionEnv,
    AdmissionRequest,
    Decision,
    MalformedReview,
    parse_review,
    render,
)

__all__ = [
    "BY_PATH",
    "ENDPOINTS",
    "AdmissionEnv",
    "AdmissionRequest",
    "Decision",
    "Endpoint",
    "MalformedReview",
    "parse_review",
    "render",
]
