"""An approver cannot move a check's timestamp (issue #25 row 16): a
check's lastTransitionTime starts its timeout, so a user may change it only
together with the entry's state, and never to a time ahead of now."""

from __future__ import annotations

import time
from typing import Any

from arbiter.core.api import format_rfc3339
from tests.webhook.test_queueunit_webhook import RESERVED, _status_update

STAMP = "2026-01-01T00:00:00Z"
PENDING: dict[str, Any] = {**RESERVED, "admissionChecks": [
    {"name": "approval", "state": "Pending", "lastTransitionTime": STAMP},
    {"name": "budget", "state": "Pending", "lastTransitionTime": STAMP}]}


def _first(**entry: Any) -> dict[str, Any]:
    return {**PENDING, "admissionChecks": [
        {"name": "approval", "state": "Pending", "lastTransitionTime": STAMP, **entry},
        PENDING["admissionChecks"][1]]}


def test_a_pending_check_cannot_be_pushed_into_the_future() -> None:
    far = format_rfc3339(time.time() + 10 * 365 * 86400)
    decision = _status_update(PENDING, _first(lastTransitionTime=far))
    assert not decision.allowed and decision.code == 403
    assert "status.admissionChecks[0].lastTransitionTime" in decision.message
    assert "only together with its state" in decision.message
    # Not even with a state change: Ready -> Pending far ahead would disarm it too.
    ahead = _status_update(PENDING, _first(state="Retry", lastTransitionTime=far))
    assert not ahead.allowed and "is in the future" in ahead.message


def test_an_answer_may_stamp_its_own_time() -> None:
    now = format_rfc3339(time.time())
    assert _status_update(PENDING, _first(state="Ready", message="ok",
                                          lastTransitionTime=now)).allowed
    # Or leave the time alone.
    assert _status_update(PENDING, _first(state="Rejected")).allowed
    garbage = _status_update(PENDING, _first(state="Ready", lastTransitionTime="soon"))
    assert not garbage.allowed and "RFC 3339" in garbage.message
