"""The pure DAG logic: validation, cycles, and the step-by-step decision.

The property tests drive `evaluate` like the controller does, against a
simulated cluster where each Job's fate is drawn at random, and check every
decision against an independent oracle.
"""

from __future__ import annotations

import dataclasses
import graphlib
import itertools
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbiter.jobflow.dag import (
    CONDITIONS,
    Attempt,
    Condition,
    CycleError,
    Step,
    evaluate,
    find_cycle,
    job_name,
    topological_order,
    validate_steps,
)

# -- helpers ------------------------------------------------------------------


def step(name: str, *targets: str, condition: Condition = "Succeeded",
         retries: int = 0) -> Step:
    return Step(name=name, template=name, targets=targets, condition=condition,
                max_retries=retries)


@st.composite
def dags(draw: st.DrawFn, max_steps: int = 8) -> list[Step]:
    """A random DAG, in a random spec order (edges only to earlier-built steps)."""
    count = draw(st.integers(1, max_steps))
    names = [f"s{i}" for i in range(count)]
    built: list[Step] = []
    for index, name in enumerate(names):
        targets = draw(st.lists(st.sampled_from(names[:index]), unique=True, max_size=3)) \
            if index else []
        condition: Condition = draw(st.sampled_from(CONDITIONS)) if targets else "Succeeded"
        built.append(Step(name=name, template=name, targets=tuple(targets),
                          condition=condition, max_retries=draw(st.integers(0, 2))))
    return list(draw(st.permutations(built)))


def _last(tries: Sequence[Attempt]) -> Attempt | None:
    return max(tries, key=lambda a: a.index) if tries else None


def oracle_failed_for_good(s: Step, tries: Sequence[Attempt]) -> bool:
    last = _last(tries)
    return last is not None and last.phase in ("Failed", "Terminated") \
        and last.index >= s.max_retries


def oracle_succeeded(tries: Sequence[Attempt]) -> bool:
    last = _last(tries)
    return last is not None and last.phase == "Succeed"


def oracle_started(tries: Sequence[Attempt]) -> bool:
    return any(a.started or a.phase == "Succeed" for a in tries)


def oracle_condition_met(s: Step, by_name: Mapping[str, Step],
                         attempts: Mapping[str, Sequence[Attempt]]) -> bool:
    """Independent restatement of dependsOn.condition over the targets.

    Once the flow failed nothing is retried, so a target whose last attempt
    failed has failed for good even with retries left."""
    targets = s.targets
    if s.condition == "Succeeded":
        return all(oracle_succeeded(attempts[t]) for t in targets)
    if s.condition == "Started":
        return all(oracle_started(attempts[t]) for t in targets)
    flow_failed = any(oracle_failed_for_good(by_name[n], attempts[n]) for n in by_name)

    def failed(t: str) -> bool:
        last = _last(attempts[t])
        if last is None or last.phase not in ("Failed", "Terminated"):
            return False
        return flow_failed or last.index >= by_name[t].max_retries

    return any(failed(t) for t in targets)


def simulate(steps: list[Step], data: st.DataObject) -> tuple[
        dict[str, list[Attempt]], list[tuple[str, int]], str]:
    """Run a flow to the end; assert every decision on the way. Returns the
    attempts, the creation log and the final flow phase."""
    by_name = {s.name: s for s in steps}
    attempts: dict[str, list[Attempt]] = {s.name: [] for s in steps}
    created: list[tuple[str, int]] = []
    for _ in range(500):
        evaluation = evaluate(steps, attempts)
        flow_failed = any(oracle_failed_for_good(by_name[n], attempts[n]) for n in by_name)
        assert (evaluation.phase == "Failed") == flow_failed
        for name, index in evaluation.create:
            s = by_name[name]
            tries = attempts[name]
            # Exactly once per attempt, attempts numbered 0, 1, 2, ...
            assert index == len(tries), (name, index, tries)
            assert (name, index) not in created
            if index == 0:
                # A step starts only after its targets meet its condition.
                assert oracle_condition_met(s, by_name, attempts), (name, attempts)
            else:
                assert tries[-1].phase in ("Failed", "Terminated")
                assert index <= s.max_retries
            if flow_failed:
                # After the flow failed, only condition: Failed steps run.
                assert s.condition == "Failed"
            tries.append(Attempt(index=index, phase="Pending"))
            created.append((name, index))
        live = [(n, i) for n, tries in attempts.items() for i, a in enumerate(tries)
                if a.phase in ("Pending", "Running")]
        if not live:
            assert not evaluation.create
            return attempts, created, evaluation.phase
        name, position = data.draw(st.sampled_from(sorted(live)), label="advance")
        current = attempts[name][position]
        if current.phase == "Pending":
            # Its pods start, or it fails before they ever run.
            fails_early = data.draw(st.booleans(), label=f"{name}#{current.index} fails early")
            new = Attempt(index=current.index, phase="Failed" if fails_early else "Running",
                          started=not fails_early)
        else:
            ok = data.draw(st.booleans(), label=f"{name}#{current.index} succeeds")
            new = Attempt(index=current.index, phase="Succeed" if ok else "Failed",
                          started=True)
        attempts[name][position] = new
    raise AssertionError("the flow did not finish in 500 moves")


# -- properties -----------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.data())
def test_random_flows_respect_dependencies_and_finish(steps: list[Step],
                                                      data: st.DataObject) -> None:
    by_name = {s.name: s for s in steps}
    attempts, _, phase = simulate(steps, data)
    final = evaluate(steps, attempts)
    assert final.create == ()
    assert final.phase == phase
    failed = [n for n in by_name if oracle_failed_for_good(by_name[n], attempts[n])]
    assert phase == ("Failed" if failed else "Succeed")
    for name, s in by_name.items():
        step_phase = final.phases[name]
        assert step_phase in ("Succeed", "Failed", "Skipped"), (name, step_phase)
        if attempts[name]:
            # Ran: one Job per attempt, the last one decided the phase.
            assert [a.index for a in attempts[name]] == list(range(len(attempts[name])))
            assert step_phase == ("Succeed" if oracle_succeeded(attempts[name]) else "Failed")
        else:
            assert step_phase == "Skipped"
            met = oracle_condition_met(s, by_name, attempts)
            # Every reachable step ran: a skipped one could not have run.
            assert not met or (failed and s.condition != "Failed"), name
    if not failed:
        # Without a failure, every step whose targets all succeeded ran and
        # succeeded, unless it waits for a failure.
        for name, s in by_name.items():
            if s.condition != "Failed" and all(final.phases[t] == "Succeed" for t in s.targets):
                assert final.phases[name] == "Succeed", name
            if s.condition == "Failed":
                assert final.phases[name] == "Skipped", name


@settings(max_examples=200, deadline=None)
@given(dags(), st.data())
def test_decisions_are_idempotent(steps: list[Step], data: st.DataObject) -> None:
    """Asking again without acting gives the same answer (restart safety):
    at a state of a run (each step's first attempts), a second evaluation
    made independently, as a restarted controller makes it (fresh copies of
    the spec and of the attempts, each step's attempts listed in another
    order, the steps looked up in another order), decides exactly what the
    first did, and evaluating changes nothing it was given."""
    attempts, _, _ = simulate(steps, data)
    seen = {name: tries[:data.draw(st.integers(0, len(tries)), label=f"{name} attempts seen")]
            for name, tries in attempts.items()}
    snapshot = {name: list(tries) for name, tries in seen.items()}
    first = evaluate(steps, seen)
    fresh_steps = [dataclasses.replace(s, targets=tuple(s.targets)) for s in steps]
    relisted = {name: [dataclasses.replace(a) for a in data.draw(st.permutations(tries),
                                                                 label=f"{name} listed")]
                for name, tries in reversed(seen.items())}
    second = evaluate(fresh_steps, relisted)
    assert first == second
    assert seen == snapshot


@st.composite
def digraphs(draw: st.DrawFn) -> tuple[list[str], dict[str, list[str]]]:
    count = draw(st.integers(1, 8))
    names = [f"n{i}" for i in range(count)]
    targets = {name: draw(st.lists(st.sampled_from(names), unique=True, max_size=3))
               for name in names}
    return names, targets


@settings(max_examples=400, deadline=None)
@given(digraphs())
def test_find_cycle_names_a_real_cycle(graph: tuple[list[str], dict[str, list[str]]]) -> None:
    names, targets = graph
    cycle = find_cycle(names, targets)
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter(
        {name: targets[name] for name in names})
    try:
        list(sorter.static_order())
        acyclic = True
    except graphlib.CycleError:
        acyclic = False
    assert (cycle is None) == acyclic
    if cycle is not None:
        assert cycle[0] == cycle[-1] and len(cycle) >= 2
        assert len(set(cycle[:-1])) == len(cycle) - 1  # simple cycle
        for before, after in itertools.pairwise(cycle):
            # Run order: `after` depends on `before`.
            assert before in targets[after], (before, after, cycle)
        # Starts at the earliest step of the spec among the cycle's.
        assert names.index(cycle[0]) == min(names.index(n) for n in cycle[:-1])


@settings(max_examples=200, deadline=None)
@given(dags())
def test_topological_order_runs_targets_first(steps: list[Step]) -> None:
    order = topological_order(steps)
    assert sorted(order) == sorted(s.name for s in steps)
    position = {name: i for i, name in enumerate(order)}
    for s in steps:
        for t in s.targets:
            assert position[t] < position[s.name]


# -- examples -------------------------------------------------------------------------


def test_validation_names_the_cycle() -> None:
    problems = validate_steps([step("a", "b"), step("b", "a"), step("c", "b")])
    assert [str(p) for p in problems] == ["spec.flows: cycle a -> b -> a"]


def test_validation_finds_longer_cycle_in_run_order() -> None:
    problems = validate_steps([step("x"), step("a", "c", "x"), step("b", "a"), step("c", "b")])
    assert [str(p) for p in problems] == ["spec.flows: cycle a -> b -> c -> a"]


def test_validation_reports_duplicates_unknown_targets_and_self_dependency() -> None:
    problems = [str(p) for p in validate_steps(
        [step("a"), step("a"), step("b", "b"), step("c", "zz")])]
    assert 'spec.flows[1].name: duplicate step name "a"' in problems
    assert 'spec.flows[2].dependsOn.targets: step "b" depends on itself' in problems
    unknown = 'spec.flows[3].dependsOn.targets: "zz" is not a step'
    assert any(p.startswith(unknown) for p in problems)
    assert not any("cycle" in p for p in problems)


def test_validation_rejects_retry_name_collision_and_long_names() -> None:
    problems = [str(p) for p in validate_steps([step("a", retries=1), step("a-r1")], "flow")]
    assert any("retry of step \"a\"" in p for p in problems)
    long_flow = "f" * 50
    problems = [str(p) for p in validate_steps([step("train-model", retries=3)], long_flow)]
    assert any("longer than 63" in p for p in problems)
    assert validate_steps([step("train", retries=3)], "f" * 40) == []


def test_failed_and_started_conditions_need_targets() -> None:
    problems = [str(p) for p in validate_steps([step("a", condition="Failed")])]
    assert problems == ["spec.flows[0].dependsOn.condition: condition Failed needs at least "
                        "one target"]


def test_evaluate_refuses_a_cycle() -> None:
    with pytest.raises(CycleError) as caught:
        evaluate([step("a", "b"), step("b", "a")], {})
    assert caught.value.cycle == ["a", "b", "a"]


def test_job_names_are_deterministic() -> None:
    assert job_name("flow", "a", 0) == "flow-a"
    assert job_name("flow", "a", 2) == "flow-a-r2"


def _run(*phases: str) -> list[Attempt]:
    return [Attempt(index=i, phase=p, started=p != "Pending")  # type: ignore[arg-type]
            for i, p in enumerate(phases)]


DIAMOND = [step("a"), step("b", "a"), step("c", "b"), step("d", "b"), step("e", "c", "d")]


def test_diamond_waits_for_both_branches() -> None:
    first = evaluate(DIAMOND, {})
    assert first.create == (("a", 0),)
    assert first.phase == "Pending"
    assert first.phases["e"] == "Waiting"
    middle = evaluate(DIAMOND, {"a": _run("Succeed"), "b": _run("Succeed"),
                                "c": _run("Succeed"), "d": _run("Running")})
    assert middle.create == ()
    assert middle.phases["e"] == "Waiting"
    assert middle.reasons["e"] == "waiting for d"
    assert middle.phase == "Running"
    done = evaluate(DIAMOND, {n: _run("Succeed") for n in "abcd"})
    assert done.create == (("e", 0),)


def test_retry_then_fail_for_good_stops_the_flow() -> None:
    steps = [step("a"), step("b", "a", retries=1), step("c", "b"),
             step("cleanup", "b", condition="Failed"), step("other", "a")]
    retry = evaluate(steps, {"a": _run("Succeed"), "b": _run("Failed"),
                             "other": _run("Running")})
    assert retry.create == (("b", 1),)
    assert retry.phase == "Running"
    failed = evaluate(steps, {"a": _run("Succeed"), "b": _run("Failed", "Failed"),
                              "other": _run("Running")})
    assert failed.phase == "Failed"
    assert failed.failed == ("b",)
    assert failed.create == (("cleanup", 0),)  # only the condition: Failed step
    assert failed.phases["c"] == "Skipped"
    assert failed.phases["b"] == "Failed"
    assert failed.reasons["b"] == "failed after 2 attempts"
    assert failed.phases["other"] == "Running"  # already running: left to finish


def test_cleanup_step_is_skipped_when_nothing_failed() -> None:
    steps = [step("a"), step("cleanup", "a", condition="Failed")]
    done = evaluate(steps, {"a": _run("Succeed")})
    assert done.phases["cleanup"] == "Skipped"
    assert done.phase == "Succeed"


def test_started_condition_runs_alongside() -> None:
    steps = [step("server"), step("client", "server", condition="Started")]
    pending = evaluate(steps, {"server": _run("Pending")})
    assert pending.create == ()
    running = evaluate(steps, {"server": _run("Running")})
    assert running.create == (("client", 0),)


def test_invalid_job_is_not_retried() -> None:
    steps = [step("a", retries=3)]
    result = evaluate(steps, {"a": [Attempt(0, "Failed", retryable=False)]})
    assert result.create == ()
    assert result.phase == "Failed"


def test_terminating_creates_nothing() -> None:
    result = evaluate(DIAMOND, {"a": _run("Succeed")}, terminating=True)
    assert result.create == ()
    assert result.phase == "Terminating"
