"""The aiohttp adapter: POST /scheduler/{filter,prioritize,preempt}.

Bytes in, a decision from the in-memory cache, bytes out, metrics. Nothing
here talks to the API server. A body that is not a well-formed request for
the verb gets HTTP 400 with a one-line reason; every answer kube-scheduler
should act on is HTTP 200 (it treats any other status as an error); before
the cache's first sync the answer is 503.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler as AiohttpHandler
from aiohttp.typedefs import Middleware

from arbiter.base import metrics
from arbiter.base.httpserve import CachedCounter, one_line, read_limited
from extender.filter import filter_nodes
from extender.preempt import preempt
from extender.prioritize import prioritize_nodes
from extender.state import ExtenderState
from extender.wire import BadRequest, parse_extender_args, parse_preemption_args

log = logging.getLogger(__name__)

PREFIX = "/scheduler"

# Characters of a 400/500 reason (kube-scheduler logs it whole).
REASON_LIMIT = 500

Handler = Callable[[web.Request], Awaitable[web.Response]]
# (state, decoded JSON body) -> (answer to serialise, result label for the metric)
Decide = Callable[[ExtenderState, Any], tuple[Any, str]]


def _filter(state: ExtenderState, body: Any) -> tuple[Any, str]:
    outcome = filter_nodes(state, parse_extender_args(body))
    return outcome.result, outcome.verdict


def _prioritize(state: ExtenderState, body: Any) -> tuple[Any, str]:
    return prioritize_nodes(state, parse_extender_args(body)), "ok"


def _preempt(state: ExtenderState, body: Any) -> tuple[Any, str]:
    outcome = preempt(state, parse_preemption_args(body))
    return outcome.result, outcome.verdict


VERBS: dict[str, Decide] = {"filter": _filter, "prioritize": _prioritize, "preempt": _preempt}


_COUNTERS = CachedCounter(metrics.extender_requests_total)  # verb, result


def decode(body: bytes) -> Any:
    if not body:
        raise BadRequest("empty body: expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"body is not valid JSON: {error}") from None


def encode(answer: Any) -> bytes:
    try:
        return orjson.dumps(answer)
    except orjson.JSONEncodeError as error:
        # Filter echoes the Nodes it was sent: one nested deeper than orjson
        # writes (254 levels) is the caller's doing.
        raise BadRequest(f"the answer would repeat a value nested too deeply: {error}") from None


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    result: str  # the `result` label of arbiter_extender_requests_total

    @property
    def content_type(self) -> str:
        return "application/json" if self.status == 200 else "text/plain"


def _bad_request(error: BadRequest, verb: str) -> Reply:
    log.info("extender bad request", extra={"verb": verb, "reason": str(error)})
    return Reply(400, (one_line(str(error), REASON_LIMIT) + "\n").encode(), "bad_request")


NOT_READY = Reply(503, b"arbiter's cache has not synced yet; try again shortly\n", "not_ready")


def respond(verb: str, state: ExtenderState, body: bytes) -> Reply:
    """One call, bytes to bytes, without I/O (and so without an await: the
    decision and its assume see one consistent cache state).

    Until the cache has synced, every call gets 503: an empty cache would
    call every pod unadmitted. kube-scheduler skips an ignorable extender
    that errs (see manifests/scheduler), as it would if arbiter were down.
    """
    if not state.store.synced:
        return NOT_READY
    try:
        answer, result = VERBS[verb](state, decode(body))
        return Reply(200, encode(answer), result)
    except BadRequest as error:
        return _bad_request(error, verb)
    except Exception as error:
        # A bug, not the caller's fault: say so (kube-scheduler retries the pod).
        log.exception("extender call failed", extra={"verb": verb})
        reason = one_line(f"internal error: {error!r}", REASON_LIMIT)
        return Reply(500, (reason + "\n").encode(), "error")


def make_handler(verb: str, state: ExtenderState, max_body: int) -> Handler:
    duration = metrics.extender_duration_seconds.labels(verb)

    async def handle(request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            reply = respond(verb, state, await read_limited(request, max_body, BadRequest))
        except BadRequest as error:
            reply = _bad_request(error, verb)
        _COUNTERS.inc(verb, reply.result)
        duration.observe(time.perf_counter() - started)
        return web.Response(status=reply.status, body=reply.body, content_type=reply.content_type)

    return handle


def peer_common_name(request: web.Request) -> str | None:
    """The commonName of the verified client certificate, if the TLS
    handshake required one (`getpeercert()` is empty otherwise)."""
    cert = request.transport.get_extra_info("peercert") if request.transport else None
    if not isinstance(cert, dict):
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def client_name_guard(allowed: frozenset[str]) -> Middleware:
    """Middleware: only a client certificate whose commonName is in `allowed`
    may call the verbs. The client CA alone is not enough: in most clusters
    it also signs kubelets' and users' certificates, and a filter answer
    holds a queue's capacity (assumed pods)."""

    @web.middleware
    async def guard(request: web.Request, handler: AiohttpHandler) -> web.StreamResponse:
        name = peer_common_name(request)
        if name not in allowed:
            shown = "no client certificate" if name is None else f"client {name[:64]!r}"
            return web.Response(status=403, text=(
                f"{shown} may not call the scheduler extender "
                f"(allowed: {', '.join(sorted(allowed))}; see --extender-client-names)"))
        return await handler(request)

    return guard


def extender_app(state: ExtenderState, *, max_body: int,
                 client_names: frozenset[str] = frozenset()) -> web.Application:
    """The sub-application mounted at `PREFIX`: the three verbs. The state
    (and its assumed placements) closes with it. `client_names`: when not
    empty, the commonNames of client certificates allowed to call."""
    middlewares = [client_name_guard(client_names)] if client_names else []
    app = web.Application(client_max_size=max_body, middlewares=middlewares)
    for verb in VERBS:
        app.router.add_post(f"/{verb}", make_handler(verb, state, max_body))

    async def close(_: web.Application) -> None:
        state.close()

    app.on_cleanup.append(close)
    return app
