"""What the fast path keeps of Jobs its webhook held and of units being
created is indexed: the webhook's question does not walk every Job held in
the last 30 s nor every creation running (arbiter.loop.fastpath)."""

from __future__ import annotations

from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.store import ClusterStore
from arbiter.loop.fastpath import HELD_UNSEEN_TTL, NAMELESS_TTL, Creations, FastPath
from arbiter.loop.inflight import InFlightWrites
from arbiter.loop.mirror import EngineMirror
from tests.loop.harness import Clock
from tests.loop.test_fastpath import job_obj, ready


def fast_path(clock: Clock, creating: Creations, known: list[ConsumerKey]) -> FastPath:
    """A FastPath on its own; `known` collects every consumer it asks about."""
    def ask(consumer: ConsumerKey) -> bool:
        known.append(consumer)
        return False

    return FastPath(store=ClusterStore(), mirror=EngineMirror, creating=creating,
                    writes=InFlightWrites(clock=clock, max_writes=1), key=b"k",
                    identity="", clock=clock, known=ask)


def job(name: str) -> ConsumerKey:
    return ConsumerKey("Job", "ns", name)


def test_creations_count_per_queue_what_the_fast_path_does_not_count_pending() -> None:
    creating = Creations()
    creating.start(job("a"), "q")
    assert creating.uncounted("q") and not creating.uncounted("other")
    creating.count(job("a"), True)  # the webhook held it: counted pending already
    assert not creating.uncounted("q")
    creating.count(job("a"), False)  # no longer (its hold expired): ahead again
    assert creating.uncounted("q")
    creating.end(job("a"))
    assert not creating.uncounted("q") and len(creating) == 0
    creating.count(job("b"), True)
    creating.start(job("b"), "q")  # held before its creation started
    assert not creating.uncounted("q")
    creating.end(job("b"))
    creating.end(job("b"))  # twice: nothing goes below zero
    creating.start(job("c"), "q")
    assert creating.uncounted("q")


async def test_the_webhook_question_does_not_walk_the_jobs_held() -> None:
    c = await ready()
    parsed = c.controller.fast.parse("ns", "x", "q", job_obj("ns", "x", "q"))
    assert parsed is not None
    desired = parsed[0]
    clock, creating = Clock(), Creations()
    asked: list[ConsumerKey] = []
    fast = fast_path(clock, creating, asked)
    for index in range(2000):
        fast.held("ns", f"j{index}", "q", desired)
    creating.start(job("j1"), "q")  # one of them being created: counted
    assert not fast.creating_in("q") and not fast.blocked("q")
    assert asked == []  # neither looked at each held Job
    creating.start(job("other"), "q")  # not held here: may be ahead
    assert fast.creating_in("q") and not fast.creating_in("q2")
    creating.end(job("other"))
    # A Job held without a name keeps its queue off the fast path a while.
    fast.held("ns", "", "q", None)
    assert fast.blocked("q") and not fast.blocked("q2")
    clock.advance(NAMELESS_TTL + 0.1)
    assert not fast.blocked("q")
    # Held Jobs are let go after their time: their creation counts as ahead then.
    clock.advance(HELD_UNSEEN_TTL)
    assert fast.creating_in("q")
    assert not fast._held  # all let go, in order


async def test_what_is_kept_of_held_jobs_stays_bounded_by_their_time() -> None:
    """Held Jobs are let go after their time even when no question reaches
    the engine (every Job held meanwhile): holding one more prunes."""
    c = await ready()
    parsed = c.controller.fast.parse("ns", "x", "q", job_obj("ns", "x", "q"))
    assert parsed is not None
    clock, creating = Clock(), Creations()
    fast = fast_path(clock, creating, [])
    for index in range(100):
        fast.held("ns", f"j{index}", "q", parsed[0])
        fast.held("ns", "", "q", None)
    clock.advance(HELD_UNSEEN_TTL + 1)
    fast.held("ns", "last", "q", parsed[0])
    fast.held("ns", "", "q", None)
    assert list(fast._held) == [job("last")] and len(fast._nameless["q"]) == 1
