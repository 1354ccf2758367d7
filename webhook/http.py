"""The aiohttp adapter: bytes in, decision, bytes out, metrics.

Everything that is not a well-formed AdmissionReview for the endpoint's
kind is answered with HTTP 400 and a one-line reason (the apiserver then
applies the webhook's failurePolicy); nothing here talks to the API server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from arbiter.base import metrics
from arbiter.base.httpserve import CachedCounter, one_line, read_limited
from arbiter.cache.changes import ChangeWaiter
from webhook.endpoints import PREFIX as PREFIX  # where the app mounts webhook_app
from webhook.endpoints import Endpoint, served
from webhook.review import (
    AdmissionEnv,
    AdmissionRequest,
    Decision,
    MalformedReview,
    parse_review,
    render,
)

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.Response]]


_COUNTERS = CachedCounter(metrics.webhook_requests_total)  # webhook, operation, allowed
_RECHECKS = CachedCounter(metrics.webhook_rechecks_total)  # outcome


def bad_request(reason: str) -> web.Response:
    return web.Response(status=400, text=one_line(reason) + "\n", content_type="text/plain")


def make_handler(endpoint: Endpoint, env: AdmissionEnv, max_body: int) -> Handler:
    duration = metrics.webhook_duration_seconds.labels(endpoint.name)

    async def handle(request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            body = await read_limited(request, max_body, MalformedReview)
            review = parse_review(body, endpoint.group, endpoint.kind)
            decision = endpoint.decide(review, env)
            if decision.recheck is not None and env.changes is not None:
                decision = await _recheck(endpoint, review, env, env.changes, decision)
        except MalformedReview as error:
            _COUNTERS.inc(endpoint.name, "unknown", "invalid")
            duration.observe(time.perf_counter() - started)
            log.info("rejected malformed review", extra={"webhook": endpoint.name,
                                                         "reason": str(error)})
            return bad_request(str(error))
        payload = render(review.uid, decision, mutating=endpoint.mutating)
        _COUNTERS.inc(endpoint.name, review.operation, "true" if decision.allowed else "false")
        duration.observe(time.perf_counter() - started)
        if not decision.allowed:
            log.info("denied", extra={"webhook": endpoint.name, "namespace": review.namespace,
                                      "object": review.name, "reason": decision.message})
        return web.Response(body=payload, content_type="application/json")

    return handle


async def _recheck(endpoint: Endpoint, review: AdmissionRequest, env: AdmissionEnv,
                   changes: ChangeWaiter, decision: Decision) -> Decision:
    """Decide again each time the record the denial rests on changes,
    until it no longer rests on one or `env.recheck_within` has passed
    (this replica's watch behind the caller's: the Job controller makes a
    Job's pods as soon as its own watch shows the Job started)."""
    deadline = time.monotonic() + env.recheck_within
    while decision.recheck is not None:
        if not await changes.changed(*decision.recheck, deadline - time.monotonic()):
            _RECHECKS.inc("unchanged")
            break
        decision = endpoint.decide(review, env)
        _RECHECKS.inc("denied" if decision.recheck is not None else "decided")
    return decision


def webhook_app(*, env: AdmissionEnv, max_body: int) -> web.Application:
    """The sub-application mounted at `PREFIX`: one POST route per endpoint."""
    app = web.Application(client_max_size=max_body)
    for endpoint in served():
        app.router.add_post(endpoint.route, make_handler(endpoint, env, max_body))
    return app

