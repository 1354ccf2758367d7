"""A held workload's children (DESIGN §13, §14): what its controller makes
for it (a RayJob's RayCluster, an LWS's StatefulSets, a JobSet's Jobs, a
TrainJob's JobSet) sits in the tenant's namespace, under the tenant's own
verbs, but its pods were admitted as the workload's: a tenant who raised a
child's replicas, parallelism or requests would run more than its queue
admitted (issue #29).

So a write that makes a child ask for more than it did (more pods in a pod
set, a new pod set, a pod requesting more of any resource) passes only when
the workload's own spec, as the cache holds it, asks for that much:

- a child whose pods its kind's integration can match to the workload's
  pod sets (`Integration.child_limits`: a RayJob's RayCluster by pod set
  name, an LWS's leader and worker StatefulSets by group) may grow up to
  them: its controller follows its workload's spec, and KubeRay's
  autoscaler moves `replicas` inside what was admitted;
- a child that spells out its workload's pods (`Integration.units_from`: a
  TrainJob's JobSet) may change while the workload waits (the loop queues
  what it then asks for), and once it is admitted only within the pod sets
  last read from it;
- any other child (a JobSet's Jobs) may not grow at all.

No identity is trusted for this: a controller's write passes because it
follows the workload, a tenant's is refused because it does not (a write
that races ahead of the cache is refused and retried by its controller).
The child is found by its controller chain, checked by uid in the cache
(`webhook.held.held_root`). arbiter's own writes never reach this.
"""

from __future__ import annotations

from collections.abc import Mapping

from arbiter.cache.workloads import WorkloadRecord
from arbiter.core.quantities import QuantityError, format_quantity
from arbiter.core.resources import Resources
from arbiter.integrations import BY_KIND
from arbiter.integrations.base import Limit, Obj, Path
from webhook.held import workload_admitted
from webhook.review import AdmissionEnv, text_field

# pod set name -> (pods, the most one pod requests, its template's path)
Profile = dict[str, tuple[int, Resources, Path]]


def where(path: Path, base: str = "request.object") -> str:
    """A path as a field name: `request.object.spec.replicatedJobs[0].template`."""
    text = base
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else f".{step}"
    return text


def _profile(kind: str, obj: Obj) -> Profile | None:
    """What the object asks for, by pod set, read by its kind's integration;
    None when its spec does not read."""
    try:
        specs = BY_KIND[kind].units(obj)
    except QuantityError:
        return None
    if specs is None:
        return None
    found: Profile = {}
    for spec in specs:
        for pod_set in spec.pod_sets:
            count, requests, _ = found.get(pod_set.name, (0, Resources(), pod_set.template))
            found[pod_set.name] = (count + pod_set.count, requests.maximum(pod_set.requests),
                                   pod_set.template)
    return found


def _shown(requests: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {format_quantity(name, amount)}"
                     for name, amount in sorted(requests.items())[:4]) or "nothing"


def _growth(bound: Mapping[str, Limit], after: Profile, than: str,
            sized_by: str) -> str | None:
    """How `after` asks for more than `bound` (what it had, or what its
    workload asks for: `than` says which), naming the field; None when it
    does not."""
    for name, (count, requests, template) in after.items():
        most, largest = bound.get(name, (0, Resources()))
        field = where(template, "")[1:]
        if count > most:
            size = f"; sized by {sized_by}" if sized_by else ""
            return f"pod set {name!r} (pod template {field}{size}) would have {count} pods " \
                f"where {than} {most}"
        if count and not requests.fits_in(largest):
            return (f"{field}.spec.containers[].resources.requests would ask for "
                    f"{_shown(requests)} a pod where {than} {_shown(largest)}")
    return None


def _limits(root: WorkloadRecord, kind: str, direct: bool) -> Mapping[str, Limit] | None:
    units = root.units
    if units is None:
        return None  # its spec does not read: nothing to grow into
    pod_sets = {ps.name: (ps.count, ps.requests) for ps in units[0].pod_sets} if units else {}
    if root.integration.units_from == kind:
        return pod_sets  # read from this child: the same pod sets
    return root.integration.child_limits(pod_sets, len(units), kind, direct)


def child_problem(env: AdmissionEnv, root: WorkloadRecord, kind: str, old: Obj | None,
                  new: Obj, owner: Obj | None) -> str | None:
    """Why a child of `root` may not become `new` (from `old`; None on
    CREATE), or None when it may. `owner` is the child's controller
    ownerReference, which reached `root` by uid."""
    integration = BY_KIND.get(kind)
    if integration is None or integration.per_pod:
        return None
    if old is not None and old.get("spec") == new.get("spec"):
        return None  # metadata only (labels, finalizers): asks for nothing new
    subject = f'it belongs to {root.kind} "{root.key}" (queue "{root.queue}")'
    after = _profile(kind, new)
    if after is None:
        return (f"{subject} and kube-arbiter cannot read what its new spec asks for "
                f"({integration.readable}); change the {root.kind} instead")
    before = _profile(kind, old) if old is not None else {}
    had = {name: (count, requests) for name, (count, requests, _) in (before or {}).items()}
    grown = _growth(had, after, "it had", integration.sized_by)
    if grown is None:
        return None
    if root.integration.units_from == kind and (
            not workload_admitted(env, root) or root.units is None):
        # Its root's pods are read from this child: the loop queues the new
        # size (and requeues an admitted root whose child first shows now).
        return None
    limits = _limits(root, kind, text_field(owner, "uid") == root.uid)
    if limits is not None:
        grown = _growth(limits, after, f"the {root.kind} asks for", integration.sized_by)
        if grown is None:
            return None
    return (f"{subject}, whose pods its queue admits as the {root.kind}'s: {grown}; change "
            f"the {root.kind} instead (kube-arbiter queues it again at the new size)")
