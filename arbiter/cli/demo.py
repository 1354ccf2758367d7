"""`arbiter demo`: three tenants share a cluster; watch their shares converge.

1. Starts the sandbox (`arbiter sandbox up`, building it on first use) with
   arbiter wired in, unless `--no-sandbox` points at a cluster of your own.
2. Creates three tenants, each a Queue and a namespace:
   `ml-training` (weight 3), `analytics` (weight 2, memory-heavy Jobs) and
   `ci` (weight 1, guaranteed a quarter of the cluster).
3. Streams Jobs: ml-training fills the whole cluster first; analytics and ci
   arrive a little later and get their share back as ml-training's Jobs
   finish (KWOK completes each pod after the run time its annotation asks
   for). Every tenant keeps submitting for a while, so the queues stay
   contended.
4. Draws a live table (the `arbiter queues` table, plus each queue's share
   over time and a progress bar of admitted / submitted Jobs); without a
   terminal it prints a snapshot every few seconds instead.
5. Ends with a summary and leaves the sandbox running.

Job sizes are fractions of the smallest node and counts are fractions of the
cluster, so the same story plays on any cluster shape.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import math
import os
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from kubernetes_asyncio import config as kube_config

from arbiter.base.kubeapi import ApiError, request_json
from arbiter.cli.queues import (
    NODES_PATH,
    QUEUES_PATH,
    Glyphs,
    QueueRow,
    capacity_of,
    dominant_share,
    glyphs_for,
    queue_row,
    render_table,
)
from arbiter.core.quantities import format_quantity
from arbiter.core.resources import Resources
from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, NodeShape, Sandbox

PART_OF = ("app.kubernetes.io/part-of", "arbiter-demo")
RUN_LABEL = "demo.arbiter.dev/run"
FIELD_MANAGER = "arbiter-demo"
IMAGE = "registry.k8s.io/pause:3.10"
# The run times and arrival times below are for this duration; they scale.
REFERENCE_DURATION = 90.0
SUBMIT_FRACTION = 0.55  # tenants submit during the first 55 % of the run
HISTORY = 16


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str  # its Queue and its namespace
    weight: int
    # Guaranteed fraction of the cluster's cpu and memory (0: none).
    guarantee: float
    # A Job's pod asks for cpu_slots × (node cpu / 4) and
    # memory_slots × (node memory / 16).
    cpu_slots: int
    memory_slots: int
    run_seconds: float  # at the reference duration
    arrives: float  # fraction of the submit window
    burst: float  # Jobs at arrival, as "times the cluster" of its dominant resource
    trickle: float  # Jobs per wave afterwards, same unit


TENANTS: tuple[Tenant, ...] = (
    Tenant("ml-training", weight=3, guarantee=0.0, cpu_slots=2, memory_slots=2,
           run_seconds=15, arrives=0.0, burst=1.5, trickle=0.15),
    Tenant("analytics", weight=2, guarantee=0.0, cpu_slots=1, memory_slots=8,
           run_seconds=12, arrives=0.15, burst=1.0, trickle=0.12),
    Tenant("ci", weight=1, guarantee=0.25, cpu_slots=1, memory_slots=1,
           run_seconds=6, arrives=0.3, burst=0.8, trickle=0.15),
)


@dataclass(frozen=True, slots=True)
class Plan:
    tenant: Tenant
    requests: Resources
    guarantee: Resources
    run_seconds: float
    # (seconds after start, how many Jobs)
    waves: tuple[tuple[float, int], ...]

    @property
    def total(self) -> int:
        return sum(count for _, count in self.waves)


def plan_tenants(capacity: Resources, node: Resources, duration: float, load: float,
                 tenants: Sequence[Tenant] = TENANTS) -> list[Plan]:
    """Sizes, arrival times and Job counts for this cluster and duration."""
    cpu_slot = max(50, node.get_amount("cpu") // 4)
    memory_slot = max(64 * 2**20, node.get_amount("memory") // 16)
    scale = duration / REFERENCE_DURATION
    window = duration * SUBMIT_FRACTION
    every = max(2.0, duration / 18)
    plans = []
    for tenant in tenants:
        requests = Resources({"cpu": tenant.cpu_slots * cpu_slot,
                              "memory": tenant.memory_slots * memory_slot})
        per_job = dominant_share(requests, capacity) or 1.0

        def jobs(fraction: float, per_job: float = per_job) -> int:
            return max(1, math.ceil(fraction * load / per_job))

        start = tenant.arrives * window
        waves = [(start, jobs(tenant.burst))]
        at = start + every
        while at < window:
            waves.append((at, jobs(tenant.trickle)))
            at += every
        guarantee = Resources({name: int(amount * tenant.guarantee)
                               for name, amount in capacity.items()
                               if name in ("cpu", "memory")})
        plans.append(Plan(tenant, requests, guarantee,
                          max(1.0, round(tenant.run_seconds * scale)), tuple(waves)))
    return plans


def smallest_node(nodes: Sequence[Mapping[str, Any]]) -> Resources:
    """The smallest cpu and memory among Ready, schedulable nodes."""
    sizes = [capacity_of([node]) for node in nodes]
    sizes = [size for size in sizes if size.get_amount("cpu") > 0]
    if not sizes:
        raise DemoError("the cluster has no Ready, schedulable node")
    return Resources({"cpu": min(s.get_amount("cpu") for s in sizes),
                      "memory": min(s.get_amount("memory") for s in sizes)})


class DemoError(RuntimeError):
    pass


# -- objects ------------------------------------------------------------------------------
def queue_object(plan: Plan) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": plan.tenant.weight, "namespaces": [plan.tenant.name]}
    if plan.guarantee:
        spec["guarantee"] = plan.guarantee.to_quantities()
    return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": plan.tenant.name, "labels": dict([PART_OF])},
            "spec": spec}


def namespace_object(plan: Plan) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": plan.tenant.name, "labels": dict([PART_OF])}}


def job_object(plan: Plan, run_id: str) -> dict[str, Any]:
    labels = {PART_OF[0]: PART_OF[1], RUN_LABEL: run_id}
    requests = plan.requests.to_quantities()
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"generateName": f"{plan.tenant.name}-", "namespace": plan.tenant.name,
                     "labels": labels},
        "spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels,
                             # KWOK completes the pod this long after it starts.
                             "annotations": {
                                 POD_COMPLETE_DELAY_ANNOTATION: f"{plan.run_seconds:.0f}s"}},
                "spec": {"restartPolicy": "Never",
                         "containers": [{"name": "work", "image": IMAGE,
                                         "resources": {"requests": requests}}]},
            },
        },
    }


# -- cluster calls ------------------------------------------------------------------------
async def _apply(api: Any, path: str, obj: Mapping[str, Any]) -> None:
    """Server-side apply (create or update) of one object."""
    await request_json(api, "PATCH", path, body=obj,
                       query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                       content_type="application/apply-patch+yaml")


async def set_up_tenants(api: Any, plans: Sequence[Plan]) -> None:
    for plan in plans:
        await _apply(api, f"/api/v1/namespaces/{plan.tenant.name}", namespace_object(plan))
        await _apply(api, f"{QUEUES_PATH}/{plan.tenant.name}", queue_object(plan))


async def clear_previous_runs(api: Any, plans: Sequence[Plan], wait: float = 60.0) -> int:
    """Delete the demo's Jobs left from an earlier run; how many there were."""
    selector = f"{PART_OF[0]}={PART_OF[1]}"
    deleted = 0
    for plan in plans:
        path = f"/apis/batch/v1/namespaces/{plan.tenant.name}/jobs"
        found = await request_json(api, "GET", path, query=[("labelSelector", selector)])
        if found.get("items"):
            deleted += len(found["items"])
            await request_json(api, "DELETE", path, query=[("labelSelector", selector)],
                               body={"propagationPolicy": "Background"})
    deadline = time.monotonic() + wait
    while deleted:
        remaining = 0
        for plan in plans:
            path = f"/apis/batch/v1/namespaces/{plan.tenant.name}/jobs"
            found = await request_json(api, "GET", path, query=[("labelSelector", selector)])
            remaining += len(found.get("items") or [])
        if not remaining or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    return deleted


async def create_job(api: Any, plan: Plan, run_id: str, attempts: int = 20) -> None:
    """Create one Job; retried while the webhook does not know the queue yet."""
    path = f"/apis/batch/v1/namespaces/{plan.tenant.name}/jobs"
    for attempt in range(attempts):
        try:
            await request_json(api, "POST", path, body=job_object(plan, run_id))
            return
        except ApiError as error:
            # Fresh Queues reach the webhook's cache a moment after creation;
            # a webhook call can also time out on a busy laptop.
            if attempt == attempts - 1 or error.status not in (400, 403, 500, 503, 504):
                raise
            await asyncio.sleep(0.5)


async def submit(api: Any, plans: Sequence[Plan], run_id: str, started: float,
                 submitted: dict[str, int], errors: list[str], parallel: int = 8) -> None:
    """Create every planned Job at its time."""
    gate = asyncio.Semaphore(parallel)
    events = sorted((at, plan.tenant.name, count, plan)
                    for plan in plans for at, count in plan.waves)

    async def one(plan: Plan) -> None:
        async with gate:
            try:
                await create_job(api, plan, run_id)
                submitted[plan.tenant.name] += 1
            except Exception as error:  # keep the demo going; say so at the end
                errors.append(f"{plan.tenant.name}: {error}")

    tasks: list[asyncio.Task[None]] = []
    for at, _, count, plan in events:
        delay = started + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks += [asyncio.ensure_future(one(plan)) for _ in range(count)]
    await asyncio.gather(*tasks)


# -- observing ----------------------------------------------------------------------------
def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(slots=True)
class JobCounts:
    created: int = 0
    admitted: int = 0
    completed: int = 0
    # Seconds from creation to start (admission) of each admitted Job.
    waits: list[float] = field(default_factory=list)


def count_jobs(items: Sequence[Mapping[str, Any]]) -> JobCounts:
    counts = JobCounts()
    for job in items:
        spec, status = job.get("spec") or {}, job.get("status") or {}
        counts.created += 1
        started = _timestamp(status.get("startTime"))
        if spec.get("suspend") is False or started is not None:
            counts.admitted += 1
            created = _timestamp((job.get("metadata") or {}).get("creationTimestamp"))
            if started is not None and created is not None:
                counts.waits.append(max(0.0, started - created))
        conditions = status.get("conditions") or []
        if int(status.get("succeeded") or 0) >= int(spec.get("completions") or 1) or any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                for c in conditions):
            counts.completed += 1
    return counts


@dataclass(slots=True)
class Observation:
    rows: list[QueueRow]
    jobs: dict[str, JobCounts]


@dataclass(slots=True)
class Tracker:
    """Queue status and Job counts over time."""

    plans: Sequence[Plan]
    capacity: Resources
    run_id: str
    history: dict[str, list[float]] = field(default_factory=dict)
    # (share, deserved share) sampled while the queue had Jobs waiting.
    contended: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    async def observe(self, api: Any) -> Observation:
        queues = await request_json(api, "GET", QUEUES_PATH,
                                    query=[("labelSelector", f"{PART_OF[0]}={PART_OF[1]}")])
        by_name = {str((q.get("metadata") or {}).get("name")): q
                   for q in queues.get("items") or []}
        jobs: dict[str, JobCounts] = {}
        rows = []
        for plan in self.plans:
            name = plan.tenant.name
            listed = await request_json(
                api, "GET", f"/apis/batch/v1/namespaces/{name}/jobs",
                query=[("labelSelector", f"{RUN_LABEL}={self.run_id}")])
            counts = count_jobs(listed.get("items") or [])
            jobs[name] = counts
            queue = by_name.get(name)
            if queue is None:
                continue
            row = queue_row(queue, self.capacity)
            history = self.history.setdefault(name, [])
            history.append(row.share)
            del history[:-HISTORY]
            if counts.created > counts.admitted and row.deserved_share is not None:
                self.contended.setdefault(name, []).append((row.share, row.deserved_share))
            rows.append(replace(row, progress=(counts.admitted, plan.total),
                                history=tuple(history)))
        return Observation(rows, jobs)


# -- drawing ------------------------------------------------------------------------------
def frame(observation: Observation, plans: Sequence[Plan], elapsed: float, duration: float,
          glyphs: Glyphs, submitted: Mapping[str, int]) -> str:
    total = sum(plan.total for plan in plans)
    jobs = observation.jobs.values()
    head = (f"kube-arbiter demo  t={elapsed:4.0f}s / {duration:.0f}s   Jobs: "
            f"{sum(submitted.values())}/{total} submitted, "
            f"{sum(j.admitted for j in jobs)} admitted, "
            f"{sum(j.completed for j in jobs)} completed")
    return head + "\n\n" + render_table(observation.rows, glyphs)


def summary(observation: Observation, tracker: Tracker, plans: Sequence[Plan],
            elapsed: float, errors: Sequence[str]) -> str:
    lines = [f"Summary after {elapsed:.0f}s:"]
    header = ("QUEUE", "WEIGHT", "JOBS", "ADMITTED", "COMPLETED", "WAIT p50", "WAIT max",
              "SHARE WHILE WAITING", "DESERVED")
    table: list[tuple[str, ...]] = [header]
    for plan in plans:
        name = plan.tenant.name
        counts = observation.jobs.get(name, JobCounts())
        waits = counts.waits
        contended = tracker.contended.get(name, [])
        table.append((
            name, str(plan.tenant.weight), str(counts.created), str(counts.admitted),
            str(counts.completed),
            f"{statistics.median(waits):.0f}s" if waits else "-",
            f"{max(waits):.0f}s" if waits else "-",
            f"{statistics.fmean(s for s, _ in contended):.2f}" if contended else "-",
            f"{statistics.fmean(d for _, d in contended):.2f}" if contended else "-",
        ))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in table]
    lines.append("  SHARE WHILE WAITING: the queue's average dominant share while it had Jobs "
                 "waiting, and DESERVED its average deserved share (weighted DRF) meanwhile.")
    if errors:
        lines.append(f"  {len(errors)} Job(s) could not be created, e.g. {errors[0]}")
    return "\n".join(lines) + "\n"


def explore_help(kubeconfig: Path, sandbox_dir: Path | None) -> str:
    cwd = Path.cwd()

    def short(path: Path) -> str:
        with contextlib.suppress(ValueError):
            return str(path.absolute().relative_to(cwd))
        return str(path)

    script = Path(sys.executable).parent / "arbiter"
    arbiter = short(script) if script.exists() else f"{short(Path(sys.executable))} -m arbiter"
    if sandbox_dir is not None:
        kubectl = short(sandbox_dir / "bin" / "kubectl")
        down = f"{arbiter} sandbox down" + (
            "" if sandbox_dir.resolve() == (cwd / ".sandbox").resolve()
            else f" --dir {shlex.quote(short(sandbox_dir))}")
        return (
            f"The sandbox keeps running in {short(sandbox_dir)}. Explore it:\n"
            f"  {kubectl} get queues\n"
            f"  {kubectl} get queueunits -A\n"
            f"  {kubectl} get jobs -n ml-training\n"
            f"  {arbiter} queues --kubeconfig {short(kubeconfig)}\n"
            f"Stop it:\n"
            f"  {down}\n")
    return (f"Explore: kubectl --kubeconfig {short(kubeconfig)} get queues; "
            f"{arbiter} queues --kubeconfig {short(kubeconfig)}\n"
            "Remove the demo: kubectl delete namespace ml-training analytics ci; "
            "kubectl delete queue ml-training analytics ci\n")


class Screen:
    """Redraws in place on a terminal; prints periodic snapshots otherwise."""

    def __init__(self, out: TextIO, live: bool, snapshot_every: float) -> None:
        self.out = out
        self.live = live
        self.snapshot_every = snapshot_every
        self._last: float | None = None

    def __enter__(self) -> Screen:
        if self.live:
            self.out.write("\x1b[?25l\x1b[2J")  # hide the cursor, clear
        return self

    def __exit__(self, *_: object) -> None:
        if self.live:
            self.out.write("\x1b[?25h")
            self.out.flush()

    def show(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.live:
            body = "".join(line + "\x1b[K\n" for line in text.splitlines())
            self.out.write("\x1b[H" + body + "\x1b[J")
        elif force or self._last is None or now - self._last >= self.snapshot_every:
            self.out.write(text + "\n")
            self._last = now
        else:
            return
        self.out.flush()


# -- the run ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Options:
    kubeconfig: Path
    sandbox_dir: Path | None
    duration: float
    refresh: float
    load: float
    live: bool
    snapshot_every: float


async def run_demo(options: Options, out: TextIO) -> int:
    client = await kube_config.new_client_from_config(config_file=str(options.kubeconfig),
                                                       persist_config=False)
    async with client:
        nodes = (await request_json(client, "GET", NODES_PATH)).get("items") or []
        capacity = capacity_of(nodes)
        plans = plan_tenants(capacity, smallest_node(nodes), options.duration, options.load)
        say(f"cluster: {len(nodes)} nodes, cpu {format_quantity('cpu', capacity.get_amount('cpu'))}"
            f", memory {format_quantity('memory', capacity.get_amount('memory'))}")
        await set_up_tenants(client, plans)
        if deleted := await clear_previous_runs(client, plans):
            say(f"deleted {deleted} Job(s) of an earlier demo run")
        for plan in plans:
            guarantee = ", guarantee " + ", ".join(
                f"{n} {format_quantity(n, a)}" for n, a in plan.guarantee.items()
            ) if plan.guarantee else ""
            say(f"tenant {plan.tenant.name}: weight {plan.tenant.weight}{guarantee}; "
                f"{plan.total} Jobs of cpu {format_quantity('cpu', plan.requests['cpu'])}, "
                f"memory {format_quantity('memory', plan.requests['memory'])}, "
                f"{plan.run_seconds:.0f}s each, from t={plan.waves[0][0]:.0f}s")
        run_id = uuid.uuid4().hex[:8]
        tracker = Tracker(plans, capacity, run_id)
        submitted = {plan.tenant.name: 0 for plan in plans}
        errors: list[str] = []
        glyphs = glyphs_for(out)
        started = time.monotonic()
        submitter = asyncio.ensure_future(
            submit(client, plans, run_id, started, submitted, errors))
        observation = Observation([], {})
        try:
            with Screen(out, options.live, options.snapshot_every) as screen:
                while True:
                    observation = await tracker.observe(client)
                    elapsed = time.monotonic() - started
                    screen.show(frame(observation, plans, elapsed, options.duration, glyphs,
                                      submitted))
                    finished = submitter.done() and all(
                        counts.completed >= plan.total
                        for plan in plans
                        for counts in [observation.jobs.get(plan.tenant.name, JobCounts())])
                    if finished or elapsed >= options.duration:
                        break
                    await asyncio.sleep(options.refresh)
                if not options.live:
                    screen.show(frame(observation, plans, time.monotonic() - started,
                                      options.duration, glyphs, submitted), force=True)
        finally:
            submitter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await submitter
        out.write("\n" + summary(observation, tracker, plans, time.monotonic() - started,
                                 errors))
        out.write("\n" + explore_help(options.kubeconfig, options.sandbox_dir))
        out.flush()
    return 0


def say(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def start_sandbox(directory: Path, nodes: int, cpu: str, memory: str) -> Path:
    """`arbiter sandbox up` (building it if needed); the kubeconfig."""
    sandbox = Sandbox(directory)
    say(f"starting the sandbox in {directory} ({nodes} nodes × {cpu} CPU, {memory}); "
        "the first run builds Kubernetes from source, which takes several minutes")
    if not sandbox.up(NodeShape(count=nodes, cpu=cpu, memory=memory)):
        say(f"reusing the sandbox already running in {directory}")
    if sandbox.arbiter_port is None:
        raise DemoError(f"the sandbox in {directory} runs without arbiter: "
                        f"`arbiter sandbox down --dir {directory}` and try again")
    return sandbox.kubeconfig


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="three tenants share a sandbox cluster: watch weighted DRF at work",
        description="Start the sandbox (building it on first use), create three tenants' "
                    "Queues and namespaces, stream Jobs from each and show their shares "
                    "converging to what weighted DRF says they deserve. The sandbox keeps "
                    "running afterwards.",
    )
    add = parser.add_argument
    add("--dir", type=Path, default=Path(".sandbox"), help="sandbox directory")
    add("--nodes", type=int, default=8, help="fake nodes in a new sandbox")
    add("--node-cpu", default="4", help="CPU of each fake node")
    add("--node-memory", default="16Gi", help="memory of each fake node")
    add("--no-sandbox", action="store_true",
        help="use the cluster of --kubeconfig instead of starting a sandbox (it must run "
             "arbiter and fake or real nodes that run the demo's pods)")
    add("--kubeconfig", type=Path, default=None,
        help="kubeconfig with --no-sandbox (default: $KUBECONFIG, else ~/.kube/config)")
    add("--duration", type=float, default=REFERENCE_DURATION,
        help="seconds the demo runs (Job run times and arrivals scale with it)")
    add("--load", type=float, default=1.0,
        help="how many Jobs, relative to the default story")
    add("--refresh", type=float, default=1.0, help="seconds between two table updates")
    add("--plain", action="store_true",
        help="print table snapshots instead of redrawing (the default without a terminal)")
    add("--snapshot-every", type=float, default=10.0,
        help="seconds between two snapshots in --plain mode")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.duration <= 0 or args.load <= 0 or args.refresh <= 0:
        print("arbiter demo: --duration, --load and --refresh must be positive",
              file=sys.stderr)
        return 2
    try:
        if args.no_sandbox:
            kubeconfig = args.kubeconfig or Path(
                os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
                or Path.home() / ".kube" / "config")
            sandbox_dir = None
        else:
            kubeconfig = start_sandbox(args.dir, args.nodes, args.node_cpu, args.node_memory)
            sandbox_dir = args.dir
        live = not args.plain and sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
        options = Options(kubeconfig=kubeconfig, sandbox_dir=sandbox_dir,
                          duration=args.duration, refresh=args.refresh, load=args.load,
                          live=live, snapshot_every=args.snapshot_every)
        return asyncio.run(run_demo(options, sys.stdout))
    except KeyboardInterrupt:
        print("\ninterrupted; the sandbox keeps running (`arbiter sandbox down` stops it)",
              file=sys.stderr)
        return 130
    except (DemoError, ApiError, OSError) as error:
        print(f"arbiter demo: {error}", file=sys.stderr)
        return 1
