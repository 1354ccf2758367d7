"""The figures of a chaos run, from what the watcher saw (watch arrival
times, this process's monotonic clock) and what the injector did:

- takeover, per leader kill: the death → the Lease held by another replica
  (its watch event) → that replica's first admission (the first QueueUnit
  admission entry with `by` = the new holder); p50/p99 of each step; and
  the same on the apiserver's side (the Lease's acquireTime → the first
  status write carrying that admission), which a watch that cannot resume
  does not delay;
- admissions per second over the run;
- Job creation (the create call's start) → its unit's first admission,
  p50/p99, in steady state (no fault in progress or within `SETTLE` s
  before) and overall;
- peak resident memory per replica (max over its incarnations).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bench.chaos_faults import Injector
from bench.chaos_watch import Judge, Violations

SETTLE = 20.0


@dataclass(slots=True)
class Figures:
    takeover_lease: list[float] = field(default_factory=list)  # death -> Lease acquired
    takeover_admit: list[float] = field(default_factory=list)  # Lease -> first admission
    takeover_total: list[float] = field(default_factory=list)  # death -> first admission
    # Lease acquireTime -> first admission written, both on the apiserver's
    # side (Judge.leases_acquired, Judge.admissions_written).
    takeover_written: list[float] = field(default_factory=list)
    takeovers: list[str] = field(default_factory=list)  # one line per leader kill
    admissions: int = 0
    admissions_per_s: float = 0.0
    latency_steady: list[float] = field(default_factory=list)
    latency_all: list[float] = field(default_factory=list)
    rss_peak: dict[str, int] = field(default_factory=dict)
    jobs: int = 0
    run_seconds: float = 0.0
    unverifiable: int = 0
    still_running: int = 0  # Jobs released but not ended when the drain stopped
    settled_later: int = 0  # judged lost when the drain stopped, not on a second look


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def figures(judge: Judge, injector: Injector, created: dict[str, float], start: float,
            drained: float, last_fault: float, peaks: dict[str, int]) -> Figures:
    out = Figures(rss_peak=dict(peaks), jobs=len(created), run_seconds=drained - start,
                  unverifiable=judge.v.unverifiable_admissions,
                  still_running=judge.still_running, settled_later=judge.settled_later)
    admissions = sorted(judge.admissions)
    for killed_at, identity in injector.kills:
        acquired = next(((t, holder) for t, holder in judge.leases
                         if t >= killed_at and holder not in ("", identity)), None)
        if acquired is None:
            out.takeovers.append(f"{identity} killed at +{killed_at - start:.0f}s: "
                                 "no other holder seen")
            continue
        out.takeover_lease.append(acquired[0] - killed_at)
        first = next((t for t, _, by in admissions if t >= acquired[0] and by == acquired[1]),
                     None)
        line = (f"{identity} killed at +{killed_at - start:.0f}s: Lease to {acquired[1]} "
                f"+{acquired[0] - killed_at:.1f}s, ")
        if first is not None:
            out.takeover_admit.append(first - acquired[0])
            out.takeover_total.append(first - killed_at)
            line += f"its first admission seen +{first - acquired[0]:.2f}s after"
        else:
            line += "no admission by it seen"
        written = _written_after_acquiring(judge, acquired[1])
        if written is not None:
            out.takeover_written.append(written)
            line += f"; written +{written:.1f}s after its acquireTime"
        out.takeovers.append(line)
    in_run = [t for t, _, _ in admissions if start <= t <= drained]
    out.admissions = len(in_run)
    if len(in_run) > 1:
        out.admissions_per_s = len(in_run) / max(1e-9, in_run[-1] - in_run[0])
    windows = [(d.started - SETTLE, d.ended + SETTLE) for d in injector.done]
    first_admitted = {u.consumer: u.first_admitted for u in judge.units.values()
                      if u.consumer and u.first_admitted is not None}
    by_key = {f"{j['ns']}/{j['name']}": uid for uid, j in judge.jobs.items()}
    for key, made in created.items():
        admitted = first_admitted.get(by_key.get(key, ""))
        if admitted is None:
            continue
        out.latency_all.append(admitted - made)
        if not any(a <= admitted and made <= b for a, b in windows):
            out.latency_steady.append(admitted - made)
    return out


def _written_after_acquiring(judge: Judge, holder: str) -> float | None:
    """The holder's Lease acquireTime -> the first status write that carried
    an admission by it (managedFields time: whole seconds, so up to 1 s
    early; a later write's when the watch missed that one)."""
    acquired = next((t for t, h in judge.leases_acquired if h == holder), None)
    written = [t for t, by in judge.admissions_written if by == holder]
    if acquired is None or not written:
        return None
    return min(written) - acquired


def _p(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"p50 {pct(values, 0.5):.2f}s  p99 {pct(values, 0.99):.2f}s  (n={len(values)})"


def table(fig: Figures, planned: list[str], done: list[str], violations: Violations,
          converged: bool) -> str:
    rows: list[tuple[str, str]] = []
    want, got = Counter(planned), Counter(done)
    for kind in sorted(want | got):
        rows.append((f"fault {kind}", f"{got[kind]}/{want[kind]} done"))
    rows += [
        ("takeover: death -> Lease acquired", _p(fig.takeover_lease)),
        ("takeover: Lease -> first admission", _p(fig.takeover_admit)),
        ("takeover: death -> first admission", _p(fig.takeover_total)),
        ("takeover: acquireTime -> first admission written", _p(fig.takeover_written)),
        ("admissions", f"{fig.admissions} ({fig.admissions_per_s:.1f}/s)"),
        ("creation -> admission, steady", _p(fig.latency_steady)),
        ("creation -> admission, all", _p(fig.latency_all)),
    ]
    rows += [(f"RSS peak {name}", f"{value / 2**20:.0f} MiB")
             for name, value in sorted(fig.rss_peak.items())]
    rows += [(name, str(count)) for name, count in violations.counts().items()]
    rows += [("admissions unverifiable (watch gap)", str(fig.unverifiable)),
             ("Jobs still running when the drain ended", str(fig.still_running)),
             ("between two writes at the drain's end, settled later", str(fig.settled_later)),
             ("shares converged to offline engine", "yes" if converged else "NO"),
             ("Jobs created / run seconds", f"{fig.jobs} / {fig.run_seconds:.0f}s")]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    return "\n".join([*lines, *(f"takeover: {line}" for line in fig.takeovers)])
