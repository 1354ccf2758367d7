"""asyncio waits that never lose a cancellation.

Before Python 3.12, `asyncio.wait_for` returns the inner result when a
cancellation arrives just as that result does, and the cancellation is
gone. A loop waiting on its wake event that way, under load (the event set
all the time), can miss the one cancel that stops it: a leader's admission
loop then runs on after its Lease is lost. `asyncio.timeout` counts
cancellations and never drops one.
"""

from __future__ import annotations

import asyncio
from typing import Any

# Seconds between cancels of a task that has not ended yet (`stop`).
STOP_RECHECK = 0.5


async def wait_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait for `event` at most `seconds` (None: no limit); whether it is set."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass
    return event.is_set()


async def stop(task: asyncio.Future[Any]) -> None:
    """Cancel `task` until it has ended, and consume its outcome: one
    cancel may be swallowed (by a library, by an old `wait_for`), and work
    that must not outlive a decision (a leader's, once its Lease is lost)
    must not hang on it."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=STOP_RECHECK)
    if not task.cancelled():
        task.exception()  # retrieved: no "never retrieved" warning
