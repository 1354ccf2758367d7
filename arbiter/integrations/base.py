"""The integration interface (DESIGN §14): what arbiter must know about a
workload kind to queue it whole. Pure: reads and writes raw objects (dicts
as the API server sends them), imports only the core.

A kind is held one of two ways:

- `suspend`: the workload has a suspend field (JobSet, RayCluster, any
  declared CRD). The webhook creates it suspended; admission writes the
  placement into its pod templates and unsuspends it; reclaim suspends it
  again and takes the placement off. Its controller creates no pods while
  suspended (or deletes them when suspended again).
- `gate`: the workload has no suspend field (StatefulSet, LeaderWorkerSet).
  Its unit is made from its spec before any pod exists; every pod its
  controller creates arrives gated (the webhook gates every pod in a managed
  namespace) and is let go while the unit is admitted, as many as the unit
  counts; reclaim evicts its pods and the unit waits again (serving
  semantics: nothing is marked Failed).

Children: objects a workload's controller creates (a JobSet's Jobs, an LWS's
StatefulSets and pods). An object whose controller chain reaches a workload
arbiter holds, matched by uid at every step, is that workload's: it gets no
unit of its own and passes the webhook as its root allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from arbiter.core.podrequests import effective_pod_requests
from arbiter.core.resources import Resources

Obj = Mapping[str, Any]
Hold = Literal["suspend", "gate"]
Outcome = Literal["Complete", "Failed"]
# A path into an object: map keys and list indexes.
Path = tuple[str | int, ...]
# How many pods, and the most one of them requests: a pod set's bound.
Limit = tuple[int, Resources]


@dataclass(frozen=True, slots=True)
class PodSetSpec:
    """One pod set of a unit, read from the workload's spec: how many pods
    of which template (`template`: the path to a PodTemplateSpec)."""

    name: str
    count: int
    requests: Resources
    template: Path


@dataclass(frozen=True, slots=True)
class UnitSpec:
    """One unit a workload needs. `suffix` names it among the workload's
    units ("" when the workload is one unit; an LWS group's index)."""

    suffix: str
    pod_sets: tuple[PodSetSpec, ...]


def dig(obj: Any, path: Path) -> Any:
    """The value at `path`, or None when any step is missing or of the wrong type."""
    for step in path:
        if isinstance(step, int):
            if not isinstance(obj, list) or not 0 <= step < len(obj):
                return None
        elif not isinstance(obj, Mapping):
            return None
        obj = obj[step] if isinstance(step, int) else obj.get(step)
    return obj


def count_at(obj: Obj, path: Path, default: int = 1) -> int | None:
    """A non-negative whole number at `path` (`default` when absent); None
    when it is there but not one (the spec is not complete or not valid)."""
    value = dig(obj, path)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def whole(value: Any) -> int:
    """`value` when it is a whole number (not a bool), else 0: a status count."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def pods_at_once(obj: Obj, job_spec: Path) -> int | None:
    """How many pods the batch/v1 JobSpec at `job_spec` runs at once:
    `min(parallelism, completions)`, parallelism defaulting to 1 and
    completions to parallelism (a work queue), as the Job controller reads
    them; None when either is there but not a whole number."""
    parallelism = count_at(obj, (*job_spec, "parallelism"))
    if parallelism is None:
        return None
    completions = count_at(obj, (*job_spec, "completions"), parallelism)
    return None if completions is None else min(parallelism, completions)


def template_requests(obj: Obj, template: Path) -> Resources | None:
    """What one pod of the template at `template` requests; None when there
    is no pod spec there. Raises QuantityError on a malformed quantity."""
    spec = dig(obj, (*template, "spec"))
    if not isinstance(spec, Mapping):
        return None
    return effective_pod_requests(spec)


def pointer(path: Path) -> str:
    """`path` as a JSON Pointer (RFC 6901)."""
    return "".join("/" + str(step).replace("~", "~0").replace("/", "~1") for step in path)


class Integration:
    """One workload kind. Subclasses set the class attributes and override
    what differs; the defaults fit a kind held by `spec.suspend` with one
    pod template at `spec.template`."""

    name: str = ""  # the --integrations flag's word: "jobset"
    group: str = ""  # "" for the core group
    version: str = "v1"
    resource: str = ""  # plural: "jobsets"
    kind: str = ""
    prefix: str = ""  # unit name prefix: "jobset" -> QueueUnit "jobset-<name>"
    hold: Hold = "suspend"
    suspend_path: Path = ("spec", "suspend")
    # Kinds this one's controller creates (informational and for the
    # webhook rules: their objects pass when their chain reaches a held root).
    children: tuple[str, ...] = ()
    # Its pods are queued one by one as plain pods; the workload holds nothing.
    per_pod: bool = False
    # Running once one of its pods is bound (its status counts no ready
    # replicas: a declared kind without readyPath).
    ready_from_pods: bool = False
    # The kind of the child its controller makes that spells out its pods
    # (TrainJob: "JobSet"): its units are that child's (read by the child's
    # integration), none until the child is seen; "" when its own spec does.
    units_from: str = ""
    # A suspend-held kind whose controller makes pods itself (KubeRay), not
    # through Jobs: they arrive gated like any pod in a managed namespace and
    # the loop lets go as many as its admitted unit counts (as for `gate`).
    gated_pods: bool = False
    # What makes an object of the kind one arbiter does not hold (`holds`).
    unheld: str = ""
    # The fields a pod set's size comes from (a denial names them).
    sized_by: str = ""
    # What a spec must be for `units` to read it (the webhook's denial).
    readable: str = "spec.replicas a whole number and spec.template a pod template"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        scope = f"/namespaces/{namespace}" if namespace is not None else ""
        return f"{base}{scope}/{self.resource}"

    def object_path(self, namespace: str, name: str) -> str:
        return f"{self.collection_path(namespace)}/{name}"

    # -- reading the spec ------------------------------------------------------------
    def templates(self, obj: Obj) -> tuple[Path, ...]:
        """Every pod template of the object (for the queue label and placement)."""
        return (("spec", "template"),)

    def labelled(self, obj: Obj) -> tuple[Path, ...]:
        """Every template the queue label goes into at creation (so that
        its children and pods carry it)."""
        return self.templates(obj)

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        """The units the object needs now; None while its spec is not
        complete (or not valid): no unit yet. Empty: none (scaled to 0)."""
        raise NotImplementedError

    def holds(self, obj: Obj) -> bool:
        """Whether arbiter holds this object at all. One it does not (a RayJob
        on an existing RayCluster) passes as if its kind were not integrated:
        no queue, no unit, and its children are their own work."""
        return True

    def suspended(self, obj: Obj) -> bool:
        return self.hold == "suspend" and dig(obj, self.suspend_path) is True

    def outcome(self, obj: Obj) -> Outcome | None:
        """Finished, from its status (None: not finished; serving kinds never are)."""
        return None

    def ready(self, obj: Obj) -> int:
        """Pods (or replicas) ready, from its status: admitted work has started."""
        return whole(dig(obj, ("status", "readyReplicas")))

    def unit_of_pod(self, labels: Mapping[str, str]) -> str:
        """Which of the workload's units a pod of it belongs to (its suffix)."""
        return ""

    def child_limits(self, pod_sets: Mapping[str, Limit], groups: int, child_kind: str,
                     direct: bool) -> Mapping[str, Limit] | None:
        """The most a child of `child_kind` that this workload's controller
        makes may ask for, by the child's own pod set names (as its kind's
        `units` names them), read from this workload's spec: `pod_sets` are
        one of its units' (all of a workload's units are alike), `groups`
        how many units it has, `direct` whether the child's controller is
        this workload itself (else an object between them: an LWS's leader
        pod). None when a child of that kind cannot be matched to its pod
        sets: such a child may then not grow at all (webhook.children)."""
        return None

    # -- writing -----------------------------------------------------------------------
    def suspend_ops(self, value: bool) -> list[dict[str, Any]]:
        """JSON Patch setting the suspend field (a suspend-held kind only)."""
        return [{"op": "add", "path": pointer(self.suspend_path), "value": value}]

    def placement_ops(self, obj: Obj, pod_sets: Sequence[str], node_selector: Mapping[str, str],
                      tolerations: Sequence[Obj]) -> list[dict[str, Any]]:
        """JSON Patch placing the named pod sets through a field of the kind's
        own (TrainJob's runtimePatches) rather than its pod templates, sent
        with the unsuspend; empty selector and tolerations take it off. Kinds
        placed in their `templates` (the rest) need none."""
        return []


def condition_true(obj: Obj, kinds: Sequence[str]) -> str | None:
    """The first of `kinds` whose status condition is True, or None."""
    conditions = dig(obj, ("status", "conditions"))
    if not isinstance(conditions, list):
        return None
    true = {c.get("type") for c in conditions
            if isinstance(c, Mapping) and c.get("status") == "True"}
    return next((kind for kind in kinds if kind in true), None)
