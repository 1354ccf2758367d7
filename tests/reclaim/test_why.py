"""Why a waiting unit is not reclaiming (issue 26): the rule that refused
each victim, in the unit's QueueUnit message and the decision log."""

from __future__ import annotations

import logging

import pytest

from arbiter.core.reclaim.flat import Admitted, ReclaimQueue, Waiting, plan
from arbiter.core.resources import Resources
from tests.loop.test_placement import node, publish
from tests.reclaim.test_loop import GRACE, ReclaimCluster


def cpu(amount: int) -> Resources:
    return Resources({"cpu": amount})


def test_each_refusal_names_the_rule() -> None:
    queues = {"t": ReclaimQueue("t"), "g": ReclaimQueue("g", guarantee=cpu(2)),
              "s": ReclaimQueue("s"), "n": ReclaimQueue("n", reclaimable=False)}
    # t holds 1 of 6 (share 1/6); s, richer with 2, would be left as poor.
    admitted = [Admitted("g/0", "g", cpu(1)), Admitted("g/1", "g", cpu(1)),
                Admitted("s/0", "s", cpu(1)), Admitted("s/1", "s", cpu(1)),
                Admitted("n/0", "n", cpu(1)), Admitted("t/h", "t", cpu(1))]
    waiting = {"t": [Waiting("t/0", "t", cpu(1))]}
    decided = plan(cpu(6), queues, admitted, waiting, due={"t"})
    assert decided.victims == ()
    (key, why), = decided.refused
    assert key == "t/0"
    assert why.startswith("not reclaiming for t/0 (queue t, weighted share 1/6 (~0.167))")
    assert "g/0 of queue g: queue g would go below its guarantee of cpu" in why
    assert ("s/0 of queue s: queue s's weighted share without it, 1/6 (~0.167), is not above "
            "1/6 (~0.167)") in why
    assert "n/0 of queue n: its queue is not reclaimable" in why
    assert why.endswith("; 2 more refused")  # one named per queue


async def test_the_waiting_unit_and_the_decision_log_say_why(
        caplog: pytest.LogCaptureFixture) -> None:
    """b may use only zone x, which c (not reclaimable) fills; a, richer,
    runs elsewhere. b starves and may take nothing: its message and one
    'hold' decision say which rule refused which victim."""
    c = ReclaimCluster()
    for index in range(4):
        await node(c, f"n{index}", **({"zone": "x"} if index < 2 else {}))
    await c.queue("c", reclaimable=False, nodeSelector={"zone": "x"})
    await c.queue("a")
    await c.queue("b", nodeSelector={"zone": "x"})
    caplog.set_level(logging.INFO, logger="arbiter.decisions")
    await c.pods("nc", "c", 2)
    await c.settle()
    await c.pods("na", "a", 2)
    await c.settle()
    await c.pods("nb", "b", 1)
    await c.settle()
    await c.look()
    await c.look(GRACE + 1)
    await c.look(1)
    assert c.released_pods("nb") == [] and c.evicting.evicted == []
    await publish(c)
    message = c.unit_obj("nb", "pod-p-000")["status"]["message"]
    assert message.startswith("waiting in queue b: not reclaiming for nb/pod-p-000"), message
    # c's units are no candidates at all (not reclaimable); a's are, on other nodes.
    assert "of queue a: frees no room on nodes queue b may use" in message
    holds = [r for r in caplog.records if getattr(r, "decision", None) == "hold"]
    assert len(holds) == 1 and getattr(holds[0], "unit", None) == "nb/pod-p-000"  # said once
    assert "frees no room on nodes" in getattr(holds[0], "reason", "")
