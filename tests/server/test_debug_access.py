"""Who may read the debug API (DESIGN §13): loopback peers, or bearer
tokens the apiserver accepts for a user who may get Queues."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.cache.store import ClusterStore
from arbiter.loop.runtime import Leadership
from arbiter.server import debug


def _app(access: debug.DebugAccess, check: debug.TokenCheck | None) -> web.Application:
    app = web.Application()
    app.add_subapp(debug.PREFIX, debug.debug_app(
        store=ClusterStore(), overcommit=1.0, leadership=Leadership(), access=access,
        check_token=check))
    return app


async def test_token_mode_needs_a_token_the_check_accepts() -> None:
    seen: list[str] = []

    async def check(token: str, source: str) -> bool:
        assert source == "127.0.0.1"
        seen.append(token)
        return token == "good"

    async with TestClient(TestServer(_app("token", check))) as client:
        assert (await client.get("/debug/queues")).status == 401
        bad = await client.get("/debug/queues", headers={"Authorization": "Bearer nope"})
        assert bad.status == 403
        good = await client.get("/debug/queues", headers={"Authorization": "Bearer good"})
        assert good.status == 200
    assert seen == ["nope", "good"]


def test_loopback_mode_tells_loopback_peers_from_others() -> None:
    assert debug._is_loopback("127.0.0.1") and debug._is_loopback("::1")
    assert not debug._is_loopback("10.0.0.7") and not debug._is_loopback(None)
    assert not debug._is_loopback("not-an-address")


async def test_reviews_are_cached_for_a_while() -> None:
    now = [0.0]
    reviewer = debug.TokenReviewer(api=None, ttl=60.0, clock=lambda: now[0])
    calls: list[str] = []

    async def review(token: str) -> bool:
        calls.append(token)
        return token == "good"

    reviewer._review = review  # type: ignore[method-assign]
    for _ in range(100):
        assert await reviewer("good") and not await reviewer("bad")
    assert calls == ["good", "bad"]  # one review each, not one per request
    now[0] = 61.0
    assert await reviewer("good")
    assert calls == ["good", "bad", "good"]


def _counting(reviewer: debug.TokenReviewer, calls: list[str], delay: float = 0.0) -> None:
    async def review(token: str) -> bool:
        calls.append(token)
        await asyncio.sleep(delay)
        return token.startswith("good")

    reviewer._review = review  # type: ignore[method-assign]


async def test_a_flood_of_new_tokens_is_throttled_and_evicts_no_token_in_use() -> None:
    now = [0.0]
    reviewer = debug.TokenReviewer(api=None, clock=lambda: now[0], rate=2.0, burst=3,
                                   max_tokens=3)
    calls: list[str] = []
    _counting(reviewer, calls)
    assert await reviewer("good")
    assert not await reviewer("random-1") and not await reviewer("random-2")
    with pytest.raises(debug.ReviewsThrottled):  # the burst is spent
        await reviewer("random-3")
    assert await reviewer("good")  # cached answers are still served
    assert calls == ["good", "random-1", "random-2"]
    now[0] = 0.5  # one review refilled
    assert not await reviewer("random-4")
    # Bad answers fill a cache of their own (3 here): a fourth drops the
    # oldest bad one, never the good one.
    now[0] = 1.0
    assert not await reviewer("random-5")
    assert await reviewer("good")
    assert calls == ["good", "random-1", "random-2", "random-4", "random-5"]
    assert len(reviewer._bad) == 3 and len(reviewer._good) == 1


async def test_a_flood_from_one_source_leaves_other_sources_their_budget() -> None:
    now = [0.0]
    reviewer = debug.TokenReviewer(api=None, clock=lambda: now[0], rate=1.0, burst=2)
    calls: list[str] = []
    _counting(reviewer, calls)
    for index in range(2):
        assert not await reviewer(f"random-{index}", "10.0.0.66")
    with pytest.raises(debug.ReviewsThrottled):
        await reviewer("random-2", "10.0.0.66")
    # Another address still gets its first review.
    assert await reviewer("good-new", "10.0.0.7")


async def test_a_known_good_token_is_re_reviewed_whatever_the_flood_spent() -> None:
    # Issue #25 row 15: after its cache time, a valid token's re-review got
    # 429 because random tokens had spent the one global budget.
    now = [0.0]
    reviewer = debug.TokenReviewer(api=None, clock=lambda: now[0], ttl=60.0, rate=1.0,
                                   burst=2, total_rate=1.0, total_burst=2)
    calls: list[str] = []
    _counting(reviewer, calls)
    assert await reviewer("good", "10.0.0.7")
    now[0] = 61.0  # its answer expired; the same source floods, then others do
    for source in ("10.0.0.7", "10.0.0.66", "10.0.0.67"):
        with pytest.raises(debug.ReviewsThrottled):
            for index in range(10):
                await reviewer(f"random-{source}-{index}", source)
    assert await reviewer("good", "10.0.0.7")
    assert calls[-1] == "good"
    # A new token now waits for the budget: the flood did spend that.
    with pytest.raises(debug.ReviewsThrottled):
        await reviewer("good-new", "10.0.0.8")


async def test_concurrent_requests_with_one_token_share_one_review() -> None:
    reviewer = debug.TokenReviewer(api=None, burst=1)
    calls: list[str] = []
    _counting(reviewer, calls, delay=0.05)
    answers = await asyncio.gather(*(reviewer("good-x") for _ in range(20)))
    assert answers == [True] * 20 and calls == ["good-x"]


async def test_throttled_reviews_are_answered_429_with_retry_after() -> None:
    async def check(token: str, source: str) -> bool:
        raise debug.ReviewsThrottled

    async with TestClient(TestServer(_app("token", check))) as client:
        answer = await client.get("/debug/queues", headers={"Authorization": "Bearer x"})
        assert answer.status == 429 and answer.headers["Retry-After"] == "1"
