"""Bounded cost of JobFlow validation (issue 13, item 5): messages are cut
before they are built, repeated targets count once, the DAG checks are
linear."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from arbiter.jobflow.dag import Step, topological_order, validate_steps
from tests.jobflow.test_webhook import check, jobflow, make_store

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crds" / "jobflow.yaml"


# The quadratic checks these replace took 1.3-3.3 s on 10k steps; linear ones
# take ~30-60 ms on a quiet machine. The bound sits between the two with room
# for a loaded CI machine, so it catches a return to list scans, not noise.
LINEAR_BOUND = 0.6


def fastest(call: Callable[[], Any], runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def chain(length: int, *, closed: bool = False) -> list[Step]:
    steps = [Step(name=f"s{i}", template="a", targets=(f"s{i - 1}",) if i else ())
             for i in range(length)]
    if closed:
        steps[0] = Step(name="s0", template="a", targets=(f"s{length - 1}",))
    return steps


def test_a_target_repeated_12000_times_costs_one_problem() -> None:
    steps = [Step(name=f"step-{i}", template="a") for i in range(200)]
    steps.append(Step(name="last", template="a", targets=("nope",) * 12_000))
    tracemalloc.start()
    try:
        problems = validate_steps(steps, "flow")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(problems) == 1 and "nope" in str(problems[0])
    assert len(str(problems[0])) < 1000
    assert peak < 5 * 2**20, f"{peak / 2**20:.1f} MiB"


def test_many_distinct_unknown_targets_give_a_bounded_list() -> None:
    steps = [Step(name=f"step-{i}", template="a") for i in range(200)]
    steps.append(Step(name="last", template="a",
                      targets=tuple(f"nope-{i}" for i in range(12_000))))
    problems = validate_steps(steps, "flow")
    text = "; ".join(map(str, problems))
    assert len(text) < 3000 and "more" in text


def test_webhook_denies_the_66_kib_flow_quickly_with_one_line() -> None:
    flows: list[dict[str, Any]] = [{"name": f"step-{i}", "template": "a"} for i in range(200)]
    flows.append({"name": "last", "template": "a", "dependsOn": {"targets": ["nope"] * 12_000}})
    obj = jobflow(flows)
    store = make_store()
    elapsed = fastest(lambda: check(obj, store))
    decision = check(obj, store)
    assert not decision.allowed and len(decision.message) <= 1000
    assert elapsed < LINEAR_BOUND, elapsed


def test_a_10k_step_chain_is_validated_and_ordered_in_linear_time() -> None:
    steps = chain(10_000)
    assert validate_steps(steps, "f") == []
    assert fastest(lambda: validate_steps(steps, "f")) < LINEAR_BOUND
    assert fastest(lambda: topological_order(steps)) < LINEAR_BOUND


def test_a_10k_step_cycle_is_found_quickly_and_named_briefly() -> None:
    steps = chain(10_000, closed=True)
    problems = validate_steps(steps, "f")
    assert len(problems) == 1 and str(problems[0]).startswith("spec.flows: cycle s0 -> s1 -> ")
    assert len(str(problems[0])) < 1000 and "10000 steps" in str(problems[0])
    assert fastest(lambda: validate_steps(steps, "f")) < LINEAR_BOUND


def test_the_crd_bounds_every_list_and_name_of_a_step() -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    flows = spec["properties"]["flows"]
    assert flows["maxItems"] <= 200
    targets = flows["items"]["properties"]["dependsOn"]["properties"]["targets"]
    assert targets["maxItems"] <= flows["maxItems"]
    assert targets["items"]["maxLength"] == 63
    assert spec["properties"]["queue"]["maxLength"] == 63


def test_thousands_of_missing_templates_give_a_bounded_message() -> None:
    flows: list[dict[str, Any]] = [{"name": f"s{i}", "template": f"gone-{i}"}
                                   for i in range(5000)]
    decision = check(jobflow(flows))
    assert not decision.allowed and "and 4990 more missing JobTemplates" in decision.message
