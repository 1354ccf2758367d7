"""The chaos run's invariant watcher: its own watches on Jobs, pods,
QueueUnits, Queues, nodes and the leader Lease (plain HTTP, bench.chaos_http),
judged here without any of arbiter's code.

Invariants (a violation is kept with a one-line description):
- **double run**: a Job never had more pods bound than its parallelism
  times the admissions its QueueUnit records (judged at the end: pods and
  units arrive on separate streams).
- **double admission**: a unit's `status.admissions` never grows without a
  requeue (phase back to Enqueued/TimeoutBackoff) seen in between. Where the
  unit watch had to list again (a 410 after an apiserver restart) the
  events in the gap are unknown: such a case is counted as unverifiable,
  not as a violation.
- **over capacity**: the pods bound to a node and not finished never
  request more than its allocatable (cpu, memory, pod count); judged on
  every pod event (one stream: etcd order).
- **over capability**: per queue (a parent: its whole subtree), the
  requests of its unfinished, not terminating pods never exceed the queue's
  capability (on every pod event); and the units it holds admitted (status
  allocated; units whose Job is finished excluded) do not stay above it
  for `SUSTAINED` seconds (sampled: unit status writes may trail).
- **lost**: at the end every Job has finished, or is admitted and released
  (unsuspended: the Job controller has it), or its unit still waits with a
  reason (a message, or at least its position in the queue).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from bench.chaos_http import quantity, resources

ADMITTED = ("Reserved", "Dequeued", "Running")
WAITING = ("Enqueued", "TimeoutBackoff")
ENDED = ("Succeed", "Failed")
JUDGED = ("cpu", "memory")
SUSTAINED = 5.0
ADMITTED_STATUS = "arbiter.dev/admitted-status"


@dataclass(slots=True)
class Unit:
    queue: str = ""
    phase: str = ""
    admissions: int = 0
    consumer: str = ""
    allocated: dict[str, Fraction] = field(default_factory=dict)
    demand: dict[str, Fraction] = field(default_factory=dict)
    pod_sets: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    position: Any = None
    requeued: bool = False  # a requeue seen since its last admission
    epoch: int = 0  # the unit watch's list count when last seen
    first_admitted: float | None = None


@dataclass(slots=True)
class Pod:
    namespace: str
    job: str  # the controlling Job's uid, or ""
    node: str
    requests: dict[str, Fraction]
    active: bool  # bound and not finished
    terminating: bool
    gated: bool = False
    phase: str = ""


@dataclass(slots=True)
class Violations:
    double_run: list[str] = field(default_factory=list)
    double_admission: list[str] = field(default_factory=list)
    over_capacity: list[str] = field(default_factory=list)
    over_capability: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    unverifiable_admissions: int = 0

    def counts(self) -> dict[str, int]:
        return {"double runs": len(self.double_run),
                "double admissions": len(self.double_admission),
                "over capacity": len(self.over_capacity),
                "over capability": len(self.over_capability),
                "lost": len(self.lost)}

    def held(self) -> bool:
        return not any(self.counts().values())


def pod_requests(spec: dict[str, Any]) -> dict[str, Fraction]:
    """What a pod requests (containers summed; init containers' max; +1 pod)."""
    total: dict[str, Fraction] = defaultdict(Fraction)
    for container in spec.get("containers") or []:
        for name, value in resources((container.get("resources") or {}).get("requests")).items():
            total[name] += value
    for container in spec.get("initContainers") or []:
        for name, value in resources((container.get("resources") or {}).get("requests")).items():
            total[name] = max(total[name], value)
    total["pods"] = Fraction(1)
    return dict(total)


def _add(into: dict[str, Fraction], values: dict[str, Fraction], sign: int = 1) -> None:
    for name, value in values.items():
        into[name] = into.get(name, Fraction(0)) + sign * value


def _over(used: dict[str, Fraction], limit: dict[str, Fraction]) -> list[str]:
    return [name for name, cap in limit.items() if used.get(name, Fraction(0)) > cap]


class Judge:
    """Everything the watches saw, and the invariants judged on it."""

    def __init__(self) -> None:
        self.v = Violations()
        self.nodes: dict[str, dict[str, Fraction]] = {}
        self.queues: dict[str, dict[str, Any]] = {}  # name -> the Queue object
        self.caps: dict[str, dict[str, Fraction]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}  # uid -> {ns, name, parallelism, done, failed}
        self.units: dict[str, Unit] = {}
        self.unit_names: dict[str, str] = {}
        self.pods: dict[str, Pod] = {}
        self.bound: dict[str, set[str]] = defaultdict(set)  # job uid -> pod uids ever bound
        self.node_use: dict[str, dict[str, Fraction]] = defaultdict(dict)
        # Requests of running pods per queue, a parent's including its subtree's.
        self.queue_use: dict[str, dict[str, Fraction]] = defaultdict(dict)
        self.ns_queue: dict[str, str] = {}
        self.unit_epoch = 0
        # (arrival, unit uid, by) per admission seen; (arrival, holder) per Lease change.
        self.admissions: list[tuple[float, str, str]] = []
        self.leases: list[tuple[float, str]] = []
        # The same on the apiserver's clock, as this process's monotonic time:
        # (written, by) per admission seen, `written` the unit's last status
        # write (its managedFields time, whole seconds: the admission's own
        # write, or a later one when the watch missed it); (acquired, holder)
        # per Lease change, `acquired` its spec.acquireTime. A watch that
        # cannot resume (the apiserver's watch cache reinitializing after a
        # restart) delays what is seen, not these.
        self.admissions_written: list[tuple[float, str]] = []
        self.leases_acquired: list[tuple[float, str]] = []
        self.wall_offset = time.time() - time.monotonic()
        self._over_since: dict[str, float] = {}
        # At the end: Jobs admitted and still running; Jobs waiting with a
        # position in their queue but no message saying why.
        self.still_running = 0
        self.waiting_silent = 0
        self.lost_uids: set[str] = set()
        self.settled_later = 0  # judged lost at the drain's end, not on a second look

    # -- topology --------------------------------------------------------------
    def on_node(self, kind: str, obj: dict[str, Any], _: float) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = resources((obj.get("status") or {}).get("allocatable"))

    def on_queue(self, kind: str, obj: dict[str, Any], _: float) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.queues.pop(name, None)
            return
        self.queues[name] = obj
        capability = resources((obj.get("spec") or {}).get("capability"))
        self.caps[name] = {k: v for k, v in capability.items() if k in JUDGED}
        for ns in (obj.get("spec") or {}).get("namespaces") or []:
            self.ns_queue[ns] = name

    def path_of(self, queue: str) -> list[str]:
        """The queue and its ancestors (a cycle is cut)."""
        path: list[str] = []
        while queue and queue not in path:
            path.append(queue)
            queue = str(((self.queues.get(queue) or {}).get("spec") or {}).get("parent") or "")
        return path

    def capability(self, queue: str) -> dict[str, Fraction]:
        return self.caps.get(queue, {})

    # -- Jobs ------------------------------------------------------------------
    def on_job(self, kind: str, obj: dict[str, Any], _: float) -> None:
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        conditions = {c.get("type") for c in status.get("conditions") or []
                      if c.get("status") == "True"}
        record = self.jobs.setdefault(meta["uid"], {"ns": meta["namespace"],
                                                    "name": meta["name"]})
        record["parallelism"] = int(spec.get("parallelism") or 1)
        record["done"] = record.get("done", False) or "Complete" in conditions
        record["failed"] = record.get("failed", False) or "Failed" in conditions
        record["deleted"] = kind == "DELETED"
        record["suspended"] = bool(spec.get("suspend"))
        record["active"] = int(status.get("active") or 0)
        record["version"] = str(meta.get("resourceVersion") or "")
        record["suspend_by"] = suspend_writer(meta)

    # -- pods ------------------------------------------------------------------
    def on_pod(self, kind: str, obj: dict[str, Any], _: float) -> None:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        uid = meta["uid"]
        old = self.pods.pop(uid, None)
        if old is not None and old.active:
            self._account(old, -1)
        if kind == "DELETED":
            return
        owner = next((ref.get("uid", "") for ref in meta.get("ownerReferences") or []
                      if ref.get("controller") and ref.get("kind") == "Job"), "")
        node = str(spec.get("nodeName") or "")
        phase = (obj.get("status") or {}).get("phase")
        pod = Pod(meta["namespace"], owner, node,
                  old.requests if old is not None else pod_requests(spec),
                  active=bool(node) and phase not in ("Succeeded", "Failed"),
                  terminating=bool(meta.get("deletionTimestamp")),
                  gated=bool(spec.get("schedulingGates")), phase=str(phase or ""))
        self.pods[uid] = pod
        if node and owner:
            self.bound[owner].add(uid)
        if pod.active:
            self._account(pod, +1)
            self._check_pod(pod, meta["namespace"] + "/" + meta["name"])

    def resync_pods(self, listed: list[dict[str, Any]]) -> None:
        """The pod watch listed again (its resourceVersion gone, after an
        apiserver restart): a pod missing from the list was deleted while
        the watch was down, its DELETED never delivered. Counted on, it
        shows its node over allocatable once another pod takes its place
        (the likely cause of run 12's two, after its apiserver restart)."""
        present = {item["metadata"]["uid"] for item in listed}
        for uid in [uid for uid in self.pods if uid not in present]:
            self.on_pod("DELETED", {"metadata": {"uid": uid}}, 0.0)

    def _account(self, pod: Pod, sign: int) -> None:
        _add(self.node_use[pod.node], pod.requests, sign)
        if not pod.terminating:
            for queue in self.path_of(self.ns_queue.get(pod.namespace, "")):
                _add(self.queue_use[queue], pod.requests, sign)

    def _check_pod(self, pod: Pod, name: str) -> None:
        allocatable = self.nodes.get(pod.node)
        if allocatable is not None:
            over = _over(self.node_use[pod.node], allocatable)
            if over:
                self.v.over_capacity.append(
                    f"node {pod.node} over allocatable {over} when {name} was bound")
        leaf = self.ns_queue.get(pod.namespace, "")
        for queue in self.path_of(leaf):
            over = _over(self.queue_use[queue], self.capability(queue))
            if over:
                self.v.over_capability.append(
                    f"queue {queue}: running pods over capability {over} with {name}")

    # -- QueueUnits ------------------------------------------------------------
    def resync_units(self, listed: list[dict[str, Any]]) -> None:
        """A relist: what happened meanwhile was not seen. A unit first seen
        here has no history either (chaos run 19: one created and admitted,
        requeued and admitted again while the watch was down arrived with 2
        admissions, judged a double admission): its first jump is not judged."""
        self.unit_epoch += 1
        for obj in listed:
            meta = obj.get("metadata") or {}
            uid = meta.get("uid")
            if uid and uid not in self.units:
                self.units[uid] = Unit(epoch=-1)
                self.unit_names[uid] = f"{meta.get('namespace')}/{meta.get('name')}"

    def on_unit(self, kind: str, obj: dict[str, Any], arrival: float) -> None:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        status = status_on_record(obj)
        uid = meta["uid"]
        if kind == "DELETED":
            self.units.pop(uid, None)
            return
        unit = self.units.get(uid)
        if unit is None:
            unit = self.units[uid] = Unit(epoch=self.unit_epoch)
            self.unit_names[uid] = f"{meta['namespace']}/{meta['name']}"
        unit.queue = str(spec.get("queue") or "")
        unit.consumer = str((spec.get("consumerRef") or {}).get("uid") or "")
        unit.pod_sets = list(spec.get("podSets") or [])
        unit.demand = {}
        for pod_set in unit.pod_sets:
            _add(unit.demand, {k: v * int(pod_set.get("count") or 0)
                               for k, v in resources(pod_set.get("requests")).items()})
        phase = str(status.get("phase") or "")
        entries = list(status.get("admissions") or [])
        added = len(entries) - unit.admissions
        if phase in WAITING and unit.phase not in WAITING and unit.admissions:
            unit.requeued = True
        if added > 0:
            needed = added - (1 if unit.admissions == 0 or unit.requeued else 0)
            if needed > 0:
                if unit.epoch != self.unit_epoch:
                    self.v.unverifiable_admissions += 1
                else:
                    self.v.double_admission.append(
                        f"unit {meta['namespace']}/{meta['name']}: admissions "
                        f"{unit.admissions} -> {len(entries)} without a requeue between "
                        f"(by {[e.get('by') for e in entries[-added - 1:]]})")
            unit.requeued = phase in WAITING
            written = self._on_our_clock(status_written(meta))
            for entry in entries[-added:]:
                self.admissions.append((arrival, uid, str(entry.get("by") or "")))
                if written is not None:
                    self.admissions_written.append((written, str(entry.get("by") or "")))
            if unit.first_admitted is None:
                unit.first_admitted = arrival
        unit.admissions = len(entries)
        unit.phase = phase
        unit.allocated = resources(status.get("allocated"))
        unit.message = str(status.get("message") or "")
        unit.position = status.get("position")
        unit.epoch = self.unit_epoch

    # -- the Lease -------------------------------------------------------------
    def on_lease(self, kind: str, obj: dict[str, Any], arrival: float) -> None:
        holder = "" if kind == "DELETED" else str(
            (obj.get("spec") or {}).get("holderIdentity") or "")
        if not self.leases or self.leases[-1][1] != holder:
            self.leases.append((arrival, holder))
            acquired = self._on_our_clock(_wall((obj.get("spec") or {}).get("acquireTime")))
            if holder and acquired is not None:
                self.leases_acquired.append((acquired, holder))

    def _on_our_clock(self, wall: float | None) -> float | None:
        return None if wall is None else wall - self.wall_offset

    def holder(self) -> str:
        return self.leases[-1][1] if self.leases else ""

    # -- sampled and final checks ----------------------------------------------
    def _job_finished(self, uid: str) -> bool:
        job = self.jobs.get(uid)
        if job is None:
            return False
        if job.get("done") or job.get("failed"):
            return True
        pods = [self.pods.get(p) for p in self.bound.get(uid, ())]
        finished = [p for p in pods if p is not None and not p.active]
        return len(finished) >= int(job.get("parallelism") or 1)

    def sample(self, now: float | None = None) -> None:
        """The admitted units per queue against its capability; a queue over
        it for `SUSTAINED` seconds in a row is a violation (once per spell)."""
        now = time.monotonic() if now is None else now
        held: dict[str, dict[str, Fraction]] = defaultdict(dict)
        holders: dict[str, list[str]] = defaultdict(list)
        for uid, unit in self.units.items():
            if unit.phase in ADMITTED and not self._job_finished(unit.consumer):
                for queue in self.path_of(unit.queue):
                    _add(held[queue], unit.allocated)
                    holders[queue].append(
                        f"{self.unit_names.get(uid, uid)} {unit.phase} "
                        f"cpu={float(unit.allocated.get('cpu', 0)):g}")
        for queue in list(self.queues):
            over = _over(held.get(queue, {}), self.capability(queue))
            if not over:
                self._over_since.pop(queue, None)
                continue
            since = self._over_since.setdefault(queue, now)
            if since >= 0 and now - since >= SUSTAINED:
                self.v.over_capability.append(
                    f"queue {queue}: admitted units over capability {over} for "
                    f"{now - since:.0f}s: cpu {float(held[queue].get('cpu', 0)):g} > "
                    f"{float(self.capability(queue).get('cpu', 0)):g}; units: "
                    + ", ".join(holders[queue]))
                self._over_since[queue] = -1.0  # reported; until it drops below

    def pipeline(self) -> str:
        """Where the unfinished Jobs are, one line: held (suspended), let go
        with no pod yet, with pods waiting for a node, with pods bound but
        not Running, running; and the pods by the same steps. It tells a
        slow admission loop from a slow Job controller, scheduler or kwok."""
        by_job: dict[str, list[Pod]] = defaultdict(list)  # its pods not yet finished
        steps: Counter[str] = Counter()
        for pod in self.pods.values():
            if pod.phase in ("Succeeded", "Failed"):
                continue
            if pod.job:
                by_job[pod.job].append(pod)
            steps["gated" if pod.gated else "unbound" if not pod.node
                  else "running" if pod.phase == "Running" else "bound"] += 1
        jobs: Counter[str] = Counter()
        for uid, job in self.jobs.items():
            if job.get("deleted") or self._job_finished(uid):
                continue
            pods = by_job.get(uid, [])
            jobs["held" if job.get("suspended") else "no pod" if not pods
                 else "running" if any(p.phase == "Running" for p in pods)
                 else "bound" if any(p.node for p in pods) else "unbound"] += 1
        order = ("held", "no pod", "unbound", "bound", "running")
        return ("Jobs " + " ".join(f"{k}={jobs[k]}" for k in order)
                + " | pods " + " ".join(f"{k}={steps[k]}"
                                         for k in ("gated", "unbound", "bound", "running")))

    def finish(self, exempt: Collection[str] = ()) -> None:
        """The end-of-run checks: double runs and lost Jobs (`exempt`: Job
        uids not judged for loss, e.g. work still meant to be running)."""
        by_consumer = self._by_consumer()
        for uid, job in self.jobs.items():
            unit = by_consumer.get(uid)
            admissions = unit.admissions if unit is not None else 0
            ran = len(self.bound.get(uid, ()))
            if ran > int(job.get("parallelism") or 1) * max(admissions, 1):
                self.v.double_run.append(
                    f"job {job['ns']}/{job['name']}: {ran} pods bound over {admissions} "
                    f"admission(s) of parallelism {job.get('parallelism')}")
            if uid in exempt or job.get("done") or job.get("failed"):
                continue
            if self._in_hand(uid, job, unit):
                self.still_running += 1
                continue
            why = self._lost(uid, job, unit)
            if why is not None:
                self.lost_uids.add(uid)
                self.v.lost.append(why)
            elif unit is not None and not unit.message:
                self.waiting_silent += 1

    def _by_consumer(self) -> dict[str, Unit]:
        return {unit.consumer: unit for unit in self.units.values() if unit.consumer}

    def _in_hand(self, uid: str, job: dict[str, Any], unit: Unit | None) -> bool:
        """Admitted, released and in the Job controller's hands (its pods to
        be made, running, or done and the Job not yet marked Complete)."""
        return unit is not None and unit.phase in ADMITTED and (
            self._job_finished(uid) or self._running(uid) or not job.get("suspended"))

    def _lost(self, uid: str, job: dict[str, Any], unit: Unit | None) -> str | None:
        if unit is None:
            return f"job {job['ns']}/{job['name']}: unfinished, no QueueUnit"
        if unit.phase not in WAITING or not (unit.message or unit.position is not None):
            return (f"job {job['ns']}/{job['name']}: unfinished, unit phase "
                    f"{unit.phase or 'none'!r}, message {unit.message!r}; {self._pods_of(uid)}; "
                    f"Job suspend {job.get('suspended')} (written by {job.get('suspend_by')}), "
                    f"status.active {job.get('active')}, resourceVersion {job.get('version')}")
        return None

    def recheck_lost(self) -> None:
        """Judge the Jobs found lost once more, a while later: a Job caught
        between two of arbiter's writes (held again by its admission timeout,
        its unit's TimeoutBackoff not yet seen) is not lost; one that is
        still neither running, ended nor waiting with a reason is."""
        by_consumer = self._by_consumer()
        still = []
        for uid in sorted(self.lost_uids):
            job, unit = self.jobs[uid], by_consumer.get(uid)
            ended = job.get("done") or job.get("failed") or self._job_finished(uid)
            why = None if ended or self._in_hand(uid, job, unit) else self._lost(uid, job, unit)
            if why is None:
                self.settled_later += 1
            else:
                still.append(why)
        self.v.lost[:] = still

    def _pods_of(self, job: str) -> str:
        pods = [p for p in self.pods.values() if p.job == job]
        phases = Counter(p.phase for p in pods)
        return (f"pods: {len(pods)} ({dict(phases)}), gated {sum(p.gated for p in pods)}, "
                f"unbound {sum(not p.node for p in pods)}")

    def _running(self, job: str) -> bool:
        return any((pod := self.pods.get(uid)) is not None and pod.active
                   for uid in self.bound.get(job, ()))

    def unfinished_jobs(self) -> int:
        """Jobs not ended (a Job whose pods all succeeded counts as ended)."""
        return sum(1 for uid in self.jobs if not self._job_finished(uid))

    def waiting_demand(self) -> dict[str, list[dict[str, Any]]]:
        """Per leaf queue, the pod sets of its units not ended (the demand
        deserved shares are computed on)."""
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for unit in self.units.values():
            if unit.phase not in ENDED and not self._job_finished(unit.consumer):
                out[unit.queue].extend(unit.pod_sets)
        return dict(out)

    def capacity(self) -> dict[str, Fraction]:
        total: dict[str, Fraction] = {}
        for allocatable in self.nodes.values():
            _add(total, {k: v for k, v in allocatable.items() if k in JUDGED})
        return total


def _wall(value: Any) -> float | None:
    """An apiserver time (RFC 3339) as seconds since the epoch."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def suspend_writer(meta: dict[str, Any]) -> str:
    """Who last wrote a Job's spec.suspend, and when ("manager Operation
    time"), from its managedFields: which view of a lost Job is current."""
    for entry in meta.get("managedFields") or ():
        if isinstance(entry, dict) and "f:suspend" in (
                (entry.get("fieldsV1") or {}).get("f:spec") or {}):
            return f"{entry.get('manager')} {entry.get('operation')} {entry.get('time')}"
    return "nobody"


def status_written(meta: dict[str, Any]) -> float | None:
    """When the object's status was last written, by the apiserver's clock:
    the newest `time` of its managedFields entries for the status subresource."""
    times = (_wall(entry.get("time")) for entry in meta.get("managedFields") or ()
             if isinstance(entry, dict) and entry.get("subresource") == "status")
    return max((t for t in times if t is not None), default=None)


def status_on_record(unit: dict[str, Any]) -> dict[str, Any]:
    """A QueueUnit's status as its API documents it (docs/fast-path.md): a
    unit created admitted carries its admission in the annotation
    `arbiter.dev/admitted-status` until its status holds `admissions`; the
    annotation's fields stand where the status has none."""
    status = unit.get("status") or {}
    if status.get("admissions"):
        return dict(status)
    text = ((unit["metadata"].get("annotations") or {}).get(ADMITTED_STATUS) or "")
    try:
        recorded = json.loads(text) if text else None
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict) or not recorded.get("admissions"):
        return dict(status)
    return {**recorded, **status}


def deserved_of(queue: dict[str, Any]) -> dict[str, Fraction]:
    deserved = (queue.get("status") or {}).get("deserved") or {}
    return {k: quantity(v) for k, v in deserved.items() if k in JUDGED}
