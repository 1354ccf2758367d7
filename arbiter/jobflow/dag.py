"""The JobFlow DAG: validation and the pure step-by-step decision.

A step depends on its `targets`; the edge t -> s reads "t runs before s".
Given the attempts each step has made so far (one Job per attempt), the
decision says which attempts to create now and the phase of every step
and of the flow. No I/O here: the controller feeds observed Jobs in and
turns the answer into API writes.

Semantics of `dependsOn.condition` (over the step's targets):

- `Succeeded` (default): every target succeeded. Never met once a target
  failed for good or was skipped.
- `Started`: every target's pods have run (a target that succeeded counts).
  Never met once a target was skipped, or failed without ever starting.
- `Failed`: some target failed for good (cleanup / alerting steps). Never
  met once every target succeeded or was skipped.

A step whose condition can never be met is `Skipped`. The flow is `Failed`
as soon as a step fails for good (its last attempt failed and it has no
retries left); from then on only `condition: Failed` steps are created,
every other step that has not started is `Skipped`. The flow is `Succeed`
when every step has succeeded or was skipped.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

# The parsed spec's types live with the JobFlow cache records (re-exported).
from arbiter.cache.jobflow_records import CONDITIONS as CONDITIONS
from arbiter.cache.jobflow_records import Condition as Condition
from arbiter.cache.jobflow_records import Step as Step

StepPhase = Literal["Waiting", "Pending", "Running", "Succeed", "Failed", "Skipped"]
FlowPhase = Literal["Pending", "Running", "Succeed", "Failed", "Terminating"]
# One attempt is one Job. `Terminated`: the Job vanished before it finished.
AttemptPhase = Literal["Pending", "Running", "Succeed", "Failed", "Terminated"]

FAILED_ATTEMPT_PHASES: frozenset[str] = frozenset({"Failed", "Terminated"})

# Job names are DNS-1123 labels (the Job controller copies them into a pod
# label), so `<flow>-<step>-r<n>` must fit in 63 characters.
MAX_JOB_NAME = 63
_RETRY_SUFFIX = re.compile(r"^(?P<base>.+)-r(?P<n>[0-9]+)$")
# Messages are bounded before they are built: at most this many problems,
# and this many step names in one list (a cycle, the steps of a flow).
MAX_PROBLEMS = 10
MAX_NAMES_SHOWN = 8


def name_list(names: Sequence[str], separator: str = ", ") -> str:
    """`names` joined, at most MAX_NAMES_SHOWN of them, with how many in all."""
    if len(names) <= MAX_NAMES_SHOWN:
        return separator.join(names)
    return f"{separator.join(names[:MAX_NAMES_SHOWN])}{separator}… ({len(names)} in all)"


def cycle_text(cycle: Sequence[str]) -> str:
    """`cycle a -> b -> a`; a long one cut, with its number of steps."""
    if len(cycle) <= MAX_NAMES_SHOWN + 1:
        return "cycle " + " -> ".join(cycle)
    shown = " -> ".join(cycle[:MAX_NAMES_SHOWN])
    return f"cycle {shown} -> … -> {cycle[-1]} ({len(cycle) - 1} steps)"


class CycleError(ValueError):
    """The steps do not form a DAG; `cycle` lists it in run order, closed."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__(cycle_text(cycle))
        self.cycle = cycle


@dataclass(frozen=True, slots=True)
class Attempt:
    index: int
    phase: AttemptPhase
    # The attempt's pods have run (for `condition: Started`).
    started: bool = False
    # False when another attempt cannot help (the Job is invalid).
    retryable: bool = True


# What evaluating a flow decided: each step's phase, why it waits, which Jobs to create.
@dataclass(frozen=True, slots=True)
class Evaluation:
    phases: Mapping[str, StepPhase]
    # Why a step is Waiting, Skipped or Failed (for the status message).
    reasons: Mapping[str, str]
    # (step, attempt index) to create now, in dependency order.
    create: tuple[tuple[str, int], ...]
    phase: FlowPhase
    # Steps that failed for good, in dependency order.
    failed: tuple[str, ...] = field(default=())


def job_name(flow: str, step: str, attempt: int) -> str:
    """Deterministic, so a restarted controller finds the Job it created."""
    base = f"{flow}-{step}"
    return base if attempt == 0 else f"{base}-r{attempt}"


def retry_collision(step: str, names: Collection[str]) -> str | None:
    """The step whose retry Job would be named like `step`'s first Job."""
    match = _RETRY_SUFFIX.match(step)
    if match is not None and int(match.group("n")) > 0 and match.group("base") in names:
        return match.group("base")
    return None


# -- structure --------------------------------------------------------------
def find_cycle(order: Sequence[str], targets: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle of the "depends on" graph in run order, closed (`[a, b, a]`:
    b depends on a, a on b), starting at the earliest step of `order`; None
    when there is none. Unknown targets are ignored."""
    known = set(order)
    position = {name: index for index, name in enumerate(order)}
    state: dict[str, int] = {}  # 1 = on the DFS path, 2 = done
    for root in order:
        if root in state:
            continue
        path: list[str] = [root]
        iterators = [iter(targets.get(root, ()))]
        state[root] = 1
        while path:
            advanced = False
            for target in iterators[-1]:
                if target not in known:
                    continue
                if state.get(target) == 1:
                    # path[i:] each depends on the next; target closes it.
                    loop = path[path.index(target):]
                    # Run order is the reverse of "depends on".
                    loop.reverse()
                    start = min(range(len(loop)), key=lambda i: position[loop[i]])
                    loop = loop[start:] + loop[:start]
                    return [*loop, loop[0]]
                if target not in state:
                    state[target] = 1
                    path.append(target)
                    iterators.append(iter(targets.get(target, ())))
                    advanced = True
                    break
            if not advanced:
                state[path.pop()] = 2
                iterators.pop()
    return None


def topological_order(steps: Sequence[Step]) -> list[str]:
    """Steps in run order (a step after its targets), ties by spec order.

    Raises CycleError naming a cycle."""
    names = [step.name for step in steps]
    position = {name: index for index, name in enumerate(names)}
    waiting = {step.name: len({t for t in step.targets if t in position}) for step in steps}
    dependents: dict[str, list[str]] = {name: [] for name in names}
    for step in steps:
        for target in set(step.targets):
            if target in position:
                dependents[target].append(step.name)
    ready = [position[name] for name, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        name = names[heapq.heappop(ready)]
        order.append(name)
        for dependent in dependents[name]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                heapq.heappush(ready, position[dependent])
    if len(order) != len(names):
        cycle = find_cycle(names, {step.name: step.targets for step in steps})
        raise CycleError(cycle or [])
    return order


@dataclass(frozen=True, slots=True)
class Problem:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def validate_steps(steps: Sequence[Step], flow_name: str = "") -> list[Problem]:
    """Structural problems of a flow: names, targets, cycles, Job name length.

    Linear in the steps and targets; at most MAX_PROBLEMS problems (then one
    saying how many more), each a bounded message."""
    problems = _Problems()
    names = [step.name for step in steps]
    known = set(names)
    seen: set[str] = set()
    for index, step in enumerate(steps):
        where = f"spec.flows[{index}]"
        if step.name in seen:
            problems.append(Problem(f"{where}.name", f'duplicate step name "{step.name}"'))
        seen.add(step.name)
        collision = retry_collision(step.name, known)
        if collision is not None:
            problems.append(Problem(
                f"{where}.name",
                f'"{step.name}" is the name of a retry of step "{collision}"\'s Job; '
                "rename the step",
            ))
        if flow_name:
            longest = job_name(flow_name, step.name, step.max_retries)
            if len(longest) > MAX_JOB_NAME:
                problems.append(Problem(
                    f"{where}.name",
                    f'Job name "{longest}" would be longer than {MAX_JOB_NAME} characters; '
                    "shorten the flow or step name",
                ))
        if step.max_retries < 0:
            problems.append(Problem(f"{where}.maxRetries", "must be 0 or more"))
        if step.condition not in CONDITIONS:
            problems.append(Problem(
                f"{where}.dependsOn.condition",
                f'"{step.condition}" is not one of {", ".join(CONDITIONS)}',
            ))
        elif step.condition != "Succeeded" and not step.targets:
            problems.append(Problem(
                f"{where}.dependsOn.condition",
                f"condition {step.condition} needs at least one target",
            ))
        for target in dict.fromkeys(step.targets):  # a repeated target counts once
            if target == step.name:
                problems.append(Problem(
                    f"{where}.dependsOn.targets", f'step "{step.name}" depends on itself'))
            elif target not in known:
                problems.append(Problem(
                    f"{where}.dependsOn.targets",
                    f'"{target}" is not a step of this flow (steps: {name_list(names)})',
                ))
    # Self-dependencies are reported above; look for longer cycles.
    targets = {step.name: [t for t in step.targets if t != step.name] for step in steps}
    cycle = find_cycle(names, targets)
    if cycle is not None:
        problems.append(Problem("spec.flows", cycle_text(cycle)))
    return problems.finish()


class _Problems(list[Problem]):
    """A list that keeps MAX_PROBLEMS problems and counts the rest."""

    dropped = 0

    def append(self, problem: Problem) -> None:
        if len(self) < MAX_PROBLEMS:
            super().append(problem)
        else:
            self.dropped += 1

    def finish(self) -> list[Problem]:
        kept = list(self)
        if self.dropped:
            kept.append(Problem("spec.flows", f"and {self.dropped} more problems"))
        return kept


# -- the decision -----------------------------------------------------------
Verdict = Literal["met", "wait", "never"]


def _verdict(step: Step, phases: Mapping[str, StepPhase],
             started: Mapping[str, bool]) -> tuple[Verdict, str]:
    targets = [t for t in dict.fromkeys(step.targets) if t in phases]
    if step.condition == "Failed":
        failed = [t for t in targets if phases[t] == "Failed"]
        if failed:
            return "met", ""
        if all(phases[t] in ("Succeed", "Skipped") for t in targets):
            return "never", "no target failed"
        return "wait", "waiting for a target to fail: " + ", ".join(
            t for t in targets if phases[t] not in ("Succeed", "Skipped"))
    if step.condition == "Started":
        blocked = [t for t in targets
                   if phases[t] == "Skipped" or (phases[t] == "Failed" and not started[t])]
        if blocked:
            return "never", f"target {blocked[0]} never started"
        pending = [t for t in targets if not started[t]]
        if not pending:
            return "met", ""
        return "wait", "waiting for " + ", ".join(pending) + " to start"
    blocked = [t for t in targets if phases[t] in ("Failed", "Skipped")]
    if blocked:
        return "never", f"target {blocked[0]} {phases[blocked[0]].lower()}"
    pending = [t for t in targets if phases[t] != "Succeed"]
    if not pending:
        return "met", ""
    return "wait", "waiting for " + ", ".join(pending)


def _failed_for_good(step: Step, last: Attempt | None) -> bool:
    return (
        last is not None
        and last.phase in FAILED_ATTEMPT_PHASES
        and (not last.retryable or last.index >= step.max_retries)
    )


def evaluate(
    steps: Sequence[Step],
    attempts: Mapping[str, Sequence[Attempt]],
    *,
    terminating: bool = False,
) -> Evaluation:
    """Which attempts to create now, and every step's and the flow's phase.

    `attempts[step]` are the step's attempts so far (any order). Raises
    CycleError when the steps are not a DAG.
    """
    by_name = {step.name: step for step in steps}
    order = topological_order(steps)
    history = {name: sorted(attempts.get(name, ()), key=lambda a: a.index) for name in by_name}
    last = {name: (tries[-1] if tries else None) for name, tries in history.items()}
    failed = tuple(name for name in order if _failed_for_good(by_name[name], last[name]))
    flow_failed = bool(failed)

    phases: dict[str, StepPhase] = {}
    reasons: dict[str, str] = {}
    started: dict[str, bool] = {}
    create: list[tuple[str, int]] = []
    for name in order:
        step = by_name[name]
        latest = last[name]
        started[name] = any(a.started or a.phase == "Succeed" for a in history[name])
        may_create = not terminating and (not flow_failed or step.condition == "Failed")
        if latest is None:
            verdict, why = _verdict(step, phases, started)
            if verdict == "never":
                phases[name], reasons[name] = "Skipped", why
            elif flow_failed and step.condition != "Failed":
                phases[name] = "Skipped"
                reasons[name] = f"flow failed: step {failed[0]} failed"
            elif verdict == "met" and may_create:
                phases[name], reasons[name] = "Waiting", "creating its Job"
                create.append((name, 0))
            else:
                phases[name] = "Waiting"
                reasons[name] = why or "the flow is terminating"
        elif latest.phase == "Succeed":
            phases[name] = "Succeed"
        elif latest.phase in FAILED_ATTEMPT_PHASES:
            can_retry = latest.retryable and latest.index < step.max_retries
            if can_retry and may_create:
                phases[name] = "Waiting"
                reasons[name] = f"retrying ({latest.index + 1} of {step.max_retries})"
                create.append((name, latest.index + 1))
            else:
                phases[name] = "Failed"
                tries = latest.index + 1
                reasons[name] = (
                    f"{'terminated' if latest.phase == 'Terminated' else 'failed'} "
                    f"after {tries} attempt{'s' if tries > 1 else ''}"
                )
        elif latest.phase == "Running":
            phases[name] = "Running"
        else:
            phases[name] = "Pending"

    flow_phase: FlowPhase
    if terminating:
        flow_phase = "Terminating"
    elif flow_failed:
        flow_phase = "Failed"
    elif all(phase in ("Succeed", "Skipped") for phase in phases.values()):
        flow_phase = "Succeed"
    elif any(history[name] for name in by_name):
        flow_phase = "Running"
    else:
        flow_phase = "Pending"
    return Evaluation(phases=phases, reasons=reasons, create=tuple(create),
                      phase=flow_phase, failed=failed)
