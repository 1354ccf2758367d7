"""The aiohttp adapter: bytes in, decision, bytes out, metrics.

Everything that is not a well-formed AdmissionReview for the endpoint's
kind is answered with HTTP 400 and a one-line reason (the apiserver then
applies the webhook's failurePolicy); nothing here talks to the API server.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from arbiter import metrics
from arbiter.httpserve import CachedCounter, one_line, read_limited
from webhook.endpoints import ENDPOINTS, Endpoint
from webhook.endpoints import PREFIX as PREFIX  # where the app mounts webhook_app
from webhook.review import AdmissionEnv, Decision, MalformedReview, parse_review, render

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.Response]]
# Runs a decision on the thread that writes the cache and returns its answer
# (`arbiter.server.on_loop`): for endpoints not `by_key` when the webhook is
# served from a thread of its own.
OnCacheThread = Callable[[Callable[[], Decision]], Awaitable[Decision]]


_COUNTERS = CachedCounter(metrics.webhook_requests_total)  # webhook, operation, allowed


def bad_request(reason: str) -> web.Response:
    return web.Response(status=400, text=one_line(reason) + "\n", content_type="text/plain")


def make_handler(endpoint: Endpoint, env: AdmissionEnv, max_body: int,
                 on_cache_thread: OnCacheThread | None = None) -> Handler:
    duration = metrics.webhook_duration_seconds.labels(endpoint.name)
    hop = None if endpoint.by_key else on_cache_thread

    async def handle(request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            body = await read_limited(request, max_body, MalformedReview)
            review = parse_review(body, endpoint.group, endpoint.kind)
            if hop is None:
                decision = endpoint.decide(review, env)
            else:
                decision = await hop(functools.partial(endpoint.decide, review, env))
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


def webhook_app(*, env: AdmissionEnv, max_body: int,
                on_cache_thread: OnCacheThread | None = None) -> web.Application:
    """The sub-application mounted at `PREFIX`: one POST route per endpoint.
    `on_cache_thread`: the app runs on a thread that does not write the
    cache; decisions that iterate the cache are sent to the one that does."""
    app = web.Application(client_max_size=max_body)
    for endpoint in ENDPOINTS:
        app.router.add_post(endpoint.route,
                            make_handler(endpoint, env, max_body, on_cache_thread))
    return app

