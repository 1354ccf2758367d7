"""Each queue's dominant share over the last hour, for the queues page's
sparklines and a queue page's chart (inline SVG, drawn on the server: no
charting library).

One sample of every queue each `STEP` seconds into a ring of `KEEP`
(one shared clock, so a queue's samples are an `array` of 4-byte floats:
1.4 KiB a queue, NaN before it existed). The sparklines (a point a
minute) are drawn once a minute, and for a queue new to the history, in
slices of `SLICE` queues between which the event loop runs (a sparkline
is ~0.2 ms of Python), so a page only copies them. Samples are taken
where the view has an engine to read without building one: on the
leader, or on a replica once someone opened the view (its kept view
follows the store from then on).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from array import array
from collections.abc import Awaitable, Callable

from arbiter.loop.mirror import EngineMirror
from arbiter.server.web.live import Counts, CountsReader

log = logging.getLogger(__name__)

STEP = 10.0
KEEP = 360
# Points of a sparkline (each the mean of KEEP / SPARK samples: a minute).
SPARK = 60
DRAW_EVERY = KEEP // SPARK  # samples between two drawings
SLICE = 4  # sparklines drawn between two yields


def _blank() -> array[float]:
    return array("f", [math.nan]) * KEEP


class ShareHistory:
    def __init__(self, step: float = STEP) -> None:
        self.step = step
        self.values: dict[str, array[float]] = {}
        self.head = -1  # slot of the newest sample
        self.last: float | None = None  # when it was taken
        self.samples = 0
        self.sparks: dict[str, str] = {}

    async def record(self, counts: Counts, now: float) -> None:
        """One sample of every queue in `counts` (queue -> (waiting,
        admitted, share)) taken at `now`; queues gone are forgotten. The
        steps missed since the last one (sampling paused: a replica nobody
        looked at, a slow engine) are left blank, so a slot stays a step."""
        missed = 0 if self.last is None else min(
            KEEP, max(0, round((now - self.last) / self.step) - 1))
        self.last = now
        if missed:
            self._blank_after(self.head, missed)
            self.head = (self.head + missed) % KEEP
        head = (self.head + 1) % KEEP
        for name in [name for name in self.values if name not in counts]:
            del self.values[name]
            self.sparks.pop(name, None)
        for name, value in counts.items():
            values = self.values.get(name)
            if values is None:
                values = self.values[name] = _blank()
            values[head] = value[2]
        self.head = head
        self.samples += 1
        due = list(counts) if self.samples % DRAW_EVERY == 1 \
            else [name for name in counts if name not in self.sparks]
        for start in range(0, len(due), SLICE):
            for name in due[start:start + SLICE]:
                values = self.values.get(name)  # (gone meanwhile: the next sample says)
                if values is not None:
                    self.sparks[name] = _spark(_ordered(values, self.head))
            await asyncio.sleep(0)

    def _blank_after(self, head: int, count: int) -> None:
        """NaN in the `count` slots after `head`, for every queue."""
        start = head + 1
        spans = [(start % KEEP, min(KEEP, start % KEEP + count))]
        if start % KEEP + count > KEEP:
            spans.append((0, start % KEEP + count - KEEP))
        for values in self.values.values():
            for low, high in spans:
                values[low:high] = _blank()[:high - low]

    def series(self, queue: str) -> list[float]:
        """The queue's samples, oldest first, KEEP of them (NaN: none)."""
        values = self.values.get(queue)
        if values is None or self.head < 0:
            return [math.nan] * KEEP
        return _ordered(values, self.head)

    def sparkline(self, queue: str) -> str:
        return self.sparks.get(queue, "")

    def chart(self, queue: str, fair: float) -> str:
        """The last hour of `queue`'s share against its fair share now."""
        return _chart(self.series(queue), fair)


def _ordered(values: array[float], head: int) -> list[float]:
    start = head + 1
    return [*values[start:], *values[:start]]


def _spark(series: list[float]) -> str:
    """SPARK points, each a minute's mean, scaled to the hour's highest."""
    per = KEEP // SPARK
    points: list[tuple[int, float]] = []
    for index in range(SPARK):
        chunk = [v for v in series[index * per:(index + 1) * per] if v == v]  # not NaN
        if chunk:
            points.append((index, sum(chunk) / len(chunk)))
    if not points:
        return ""
    if len(points) == 1:  # a line needs two: a minute-wide step
        x, value = points[0]
        points = [(x - 1, value), (x, value)] if x else [(x, value), (x + 1, value)]
    top = max(max(v for _, v in points), 1e-9)
    low, high = min(v for _, v in points), max(v for _, v in points)
    line = " ".join(f"{x},{19 - 17 * v / top:.1f}" for x, v in points)
    return (f'<svg class="spark" viewBox="0 0 {SPARK - 1} 20" preserveAspectRatio="none">'
            f'<title>share over the last hour: {100 * low:.1f}% to {100 * high:.1f}%</title>'
            f'<line x1="0" x2="{SPARK - 1}" y1="19" y2="19"/><polyline points="{line}"/></svg>')


def _chart(series: list[float], fair: float) -> str:
    width, height = 720, 160
    known = [(x, v) for x, v in enumerate(series) if not math.isnan(v)]
    top = max([fair, *(v for _, v in known), 1e-9]) * 1.1
    step = width / (KEEP - 1)

    def y(value: float) -> float:
        return height - height * value / top

    line = " ".join(f"{x * step:.1f},{y(v):.1f}" for x, v in known)
    # The latest sample as a dot too (one sample is no line yet).
    last = f'<circle cx="{known[-1][0] * step:.1f}" cy="{y(known[-1][1]):.1f}" r="3"/>' \
        if known else ""
    return (
        f'<svg class="chart" viewBox="-40 -10 {width + 70} {height + 30}" role="img">'
        f'<title>dominant share over the last hour</title>'
        f'<rect x="0" y="0" width="{width}" height="{height}" class="frame"/>'
        f'<line x1="0" x2="{width}" y1="{y(fair):.1f}" y2="{y(fair):.1f}" class="fair"/>'
        f'<text x="{width + 4}" y="{y(fair) + 4:.1f}" class="fair">fair</text>'
        f'<polyline points="{line}"/>{last}'
        f'<text x="-4" y="4" text-anchor="end">{100 * top:.1f}%</text>'
        f'<text x="-4" y="{height}" text-anchor="end">0</text>'
        f'<text x="0" y="{height + 16}">1 h ago</text>'
        f'<text x="{width}" y="{height + 16}" text-anchor="end">now</text></svg>')


async def sample(history: ShareHistory, read: Callable[[], Awaitable[EngineMirror | None]],
                 clock: Callable[[], float] = time.time, step: float = STEP) -> None:
    """Take a sample every `step` seconds, for as long as it runs."""
    counts_of = CountsReader()
    while True:
        await asyncio.sleep(step)
        try:
            mirror = await read()
            if mirror is not None:
                await history.record(await counts_of(mirror), clock())
        except Exception:  # one failed sample must not end the history
            log.exception("web view: sampling the shares failed")

