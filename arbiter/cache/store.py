"""The in-memory store of slim records, with the indexes decisions need.

Single-threaded by design: the asyncio loop that applies watch events is
the same one that serves webhook and extender requests, so readers always
see a consistent store without locks.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from arbiter.cache import access, convert
from arbiter.cache.capacity import CapacityLedger
from arbiter.cache.jobflow_records import (
    JobFlowRecord,
    JobTemplateRecord,
    jobflow_from_api,
    jobtemplate_from_api,
)
from arbiter.cache.pools import PoolMembership
from arbiter.cache.records import (
    AdmissionCheckRecord,
    JobRecord,
    NamespaceRecord,
    NodeRecord,
    PodRecord,
    PoolRecord,
    PriorityClassRecord,
    QueueRecord,
    RuntimeClassRecord,
    UnitRecord,
)
from arbiter.cache.workloads import OwnerIndex, WorkloadRecord, follow_child, workload_from_api
from arbiter.core.api import QUEUE_LABEL, ManagedNamespaces
from arbiter.core.resources import Resources
from arbiter.integrations import BY_KIND, Integration, held_kinds

log = logging.getLogger(__name__)

Kind = Literal["Queue", "Namespace", "Node", "Pod", "Job", "QueueUnit", "PriorityClass", "JobFlow",
               "JobTemplate", "Pool", "AdmissionCheck", "RuntimeClass", "JobSet", "StatefulSet",
               "LeaderWorkerSet", "Deployment", "TrainJob", "RayCluster", "RayJob"]
# Kinds integrations hold, as WorkloadRecords (declared ones join at startup).
WORKLOAD_KINDS: list[Kind] = ["JobSet", "StatefulSet", "LeaderWorkerSet", "Deployment",
                              "TrainJob", "RayCluster", "RayJob"]
# The kinds `synced` waits for; JobFlow and JobTemplate (read only by the
# JobFlow controller and webhook) are not among them. Pool is: admitting
# before the Pools are known would place work into the wrong pool; so is
# AdmissionCheck: before they are known a unit could skip its checks.
KINDS: tuple[Kind, ...] = ("Queue", "Namespace", "Node", "Pod", "Job", "QueueUnit",
                           "PriorityClass", "Pool", "AdmissionCheck", "RuntimeClass")
# Kinds filed under namespace/name; Pods are filed by uid, the rest by name.
NAMESPACED_KINDS: set[Kind] = {"Job", "QueueUnit", "JobFlow", "JobTemplate", *WORKLOAD_KINDS}
EventType = Literal["ADDED", "MODIFIED", "DELETED"]


def store_key(kind: Kind, obj: Mapping[str, Any]) -> str:
    """The key the store files a raw object under (see ClusterStore tables)."""
    meta = obj.get("metadata") or {}
    if kind == "Pod":
        return str(meta.get("uid", ""))
    if kind in NAMESPACED_KINDS:
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    return str(meta.get("name", ""))

# Raw object -> record, per kind (see ClusterStore.apply).
_CONVERTERS: dict[Kind, Callable[[Mapping[str, Any]], Any]] = {
    "Queue": convert.queue_from_api, "Namespace": convert.namespace_from_api,
    "Node": convert.node_from_api, "Pod": convert.pod_from_api, "Job": convert.job_from_api,
    "QueueUnit": convert.unit_from_api, "PriorityClass": convert.priority_class_from_api,
    "JobFlow": jobflow_from_api, "JobTemplate": jobtemplate_from_api,
    "Pool": convert.pool_from_api, "AdmissionCheck": convert.admission_check_from_api,
    "RuntimeClass": convert.runtime_class_from_api,
    **{kind: partial(workload_from_api, BY_KIND[kind]) for kind in WORKLOAD_KINDS},
}
# Declared kinds add theirs at startup (arbiter.cache.declared).
CONVERTERS = _CONVERTERS

DEFAULT_EXCLUDED_NAMESPACES: tuple[str, ...] = (
    "kube-system", "kube-public", "kube-node-lease", "arbiter-system",
)



def no_queue_message(namespace: str, what: str) -> str:
    """Why work in a managed namespace has no queue (`resolve_queue` found
    none), and how to fix it: the webhook's denial and the extender's reason."""
    return (
        f'namespace "{namespace}" has no queue: label the {what} or namespace with '
        f'{QUEUE_LABEL}=<queue>, or list "{namespace}" in a Queue\'s spec.namespaces'
    )


# Called with (kind, key) after every change; the loop uses it to wake up.
Listener = Callable[[Kind, str], None]
@dataclass(slots=True)
class ClusterStore:
    excluded_namespaces: frozenset[str] = frozenset(DEFAULT_EXCLUDED_NAMESPACES)
    # `--managed-namespaces` (DESIGN §3): "all" but the excluded and opted
    # out, or only those "listed" (a Queue admits them, or labelled in).
    managed_mode: ManagedNamespaces = "all"
    queues: dict[str, QueueRecord] = field(default_factory=dict)
    namespaces: dict[str, NamespaceRecord] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    pods: dict[str, PodRecord] = field(default_factory=dict)  # by uid
    jobs: dict[str, JobRecord] = field(default_factory=dict)  # by namespace/name
    units: dict[str, UnitRecord] = field(default_factory=dict)  # by namespace/name
    priority_classes: dict[str, PriorityClassRecord] = field(default_factory=dict)
    runtime_classes: dict[str, RuntimeClassRecord] = field(default_factory=dict)
    jobflows: dict[str, JobFlowRecord] = field(default_factory=dict)  # by namespace/name
    jobtemplates: dict[str, JobTemplateRecord] = field(default_factory=dict)  # by namespace/name
    pools: dict[str, PoolRecord] = field(default_factory=dict)
    admission_checks: dict[str, AdmissionCheckRecord] = field(default_factory=dict)
    # node -> pool and pool -> nodes, kept as nodes and Pools change.
    membership: PoolMembership = field(default_factory=PoolMembership)
    # namespace -> queue listing it in spec.namespaces
    queue_by_namespace: dict[str, str] = field(default_factory=dict)
    # queue -> names of the Queues naming it in spec.parent (DESIGN §11)
    queue_children: dict[str, set[str]] = field(default_factory=dict)
    pods_by_node: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    # namespace/name -> uid, to find pods by name
    pod_uid_by_name: dict[str, str] = field(default_factory=dict)
    # namespace/Job uid -> uids of the pods there whose controller ownerRef
    # names it. The namespace is part of the key: an ownerRef is any uid a
    # tenant types, and one from another namespace is no Job's pod.
    pods_by_job: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    # kind -> namespace/name -> record, for the optional integrations' kinds.
    workloads: dict[str, dict[str, WorkloadRecord]] = field(
        default_factory=lambda: {kind: {} for kind in WORKLOAD_KINDS})
    # The optional integrations switched on (`--integrations`).
    integrations: tuple[Integration, ...] = ()
    # Declared kinds not switched on (their CRD missing or refused) -> why.
    declared_off: dict[str, str] = field(default_factory=dict)
    # Controller links by uid, for the owner walk (Jobs, workloads, pods).
    owners: OwnerIndex = field(default_factory=OwnerIndex.empty)
    listeners: list[Listener] = field(default_factory=list)
    synced_kinds: set[Kind] = field(default_factory=set)
    # The capacity, kept as nodes and pods change (arbiter.cache.capacity).
    _capacity: CapacityLedger = field(init=False)
    # namespace -> how many QueueUnits it holds (the webhook's per-namespace limit).
    units_per_namespace: dict[str, int] = field(default_factory=dict, init=False)
    # consumer uid -> key of the unit standing for it: a consumer's unit is
    # found by uid, whatever its name (the loop names it `job-<name>-<uid>`
    # when a unit of another consumer holds `job-<name>`).
    unit_by_consumer_uid: dict[str, str] = field(default_factory=dict, init=False)
    # namespace -> the queues admitting it explicitly (`AccessIndex.admitting`),
    # computed on demand; dropped when a Queue's namespaces or that
    # namespace change.
    _admitting: dict[str, tuple[str, ...]] = field(default_factory=dict, init=False)
    # Counts the changes of which namespaces each Queue admits (the loop
    # looks at every unit again after one), and the index of those rules.
    access_generation: int = field(default=0, init=False)
    _access: access.AccessIndex | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._capacity = CapacityLedger(self.nodes, self.pods, self.is_managed_namespace)

    # -- queries -------------------------------------------------------------
    def is_managed_namespace(self, namespace: str) -> bool:
        """DESIGN §3: never the excluded ones nor those labelled out; in
        `all` mode every other namespace, in `listed` mode those labelled in
        or admitted explicitly by some Queue."""
        if namespace in self.excluded_namespaces:
            return False
        record = self.namespaces.get(namespace)
        if record is not None and not record.managed_label:
            return False
        if self.managed_mode == "all":
            return True
        return (record is not None and record.opted_in) or bool(self.admitting_queues(namespace))

    def admitting_queues(self, namespace: str) -> tuple[str, ...]:
        """The queues that admit `namespace` explicitly (`access.names_namespace`)."""
        found = self._admitting.get(namespace)
        if found is None:
            if len(self._admitting) > 100_000:  # bounded, whatever is asked
                self._admitting.clear()
            if self._access is None:
                self._access = access.AccessIndex(self.queues.values())
            found = self._access.admitting(namespace, self.namespaces.get(namespace))
            self._admitting[namespace] = found
        return found

    def queue_admits(self, queue: str, namespace: str) -> bool:
        """Work in `namespace` may use `queue` (DESIGN §13): the one rule the
        webhook and the admission loop both apply. False for an unknown queue."""
        record = self.queues.get(queue)
        if record is None:
            return False
        return access.open_queue(record) or queue in self.admitting_queues(namespace)

    def usable_queues(self, namespace: str) -> list[str]:
        """Every queue `namespace` may use, sorted (for messages: O(queues))."""
        return sorted({*self.admitting_queues(namespace),
                       *(q.name for q in self.queues.values() if access.open_queue(q))})

    def resolve_queue(self, namespace: str, labels: Mapping[str, str] | None) -> str | None:
        """The one queue resolver: object label, else the Queue listing the
        namespace, else the namespace's own label."""
        if labels:
            explicit = labels.get(QUEUE_LABEL)
            if explicit:
                return explicit
        listed = self.queue_by_namespace.get(namespace)
        if listed is not None:
            return listed
        record = self.namespaces.get(namespace)
        return record.queue_label if record is not None else None

    def capacity(self, overcommit: float = 1.0) -> Resources:
        """Allocatable of Ready, schedulable nodes minus the requests of the
        unmanaged Pending or Running pods on those nodes (pods on a cordoned
        or NotReady node take nothing from nodes that are counted).

        O(number of resource names): kept up to date by every node and pod
        change."""
        return self._capacity.total(overcommit)

    def pods_on_node(self, node: str) -> Iterable[PodRecord]:
        for uid in self.pods_by_node.get(node, ()):
            pod = self.pods.get(uid)
            if pod is not None:
                yield pod

    def pod_by_name(self, namespace: str, name: str) -> PodRecord | None:
        uid = self.pod_uid_by_name.get(f"{namespace}/{name}")
        return self.pods.get(uid) if uid is not None else None

    def pool_of_node(self, node: str) -> str | None:
        """The pool `node` belongs to (DESIGN §10); None for an unknown node. O(1)."""
        return self.membership.pool_of(node)

    def nodes_in_pool(self, pool: str) -> Set[str]:
        """The names of the nodes in `pool` (a read-only live view). O(1)."""
        return self.membership.nodes_in(pool)

    @property
    def synced(self) -> bool:
        """Every kind listed once (an integration's whose CRD is missing
        counts as listed: it has no objects)."""
        held = set(held_kinds(self.integrations))
        held |= {c for i in self.integrations for c in i.children if c in WORKLOAD_KINDS}
        return self.synced_kinds >= {*KINDS, *held}

    # -- updates -------------------------------------------------------------
    def _notify(self, kind: Kind, key: str) -> None:
        for listener in self.listeners:
            listener(kind, key)

    def upsert_queue(self, record: QueueRecord) -> None:
        old = self.queues.get(record.name)
        access_changed = old is None or (old.namespaces, old.namespace_selector) != (
            record.namespaces, record.namespace_selector)
        if access_changed:
            self._admitting.clear()
            self._access = None
            self.access_generation += 1
        self._drop_queue_index(record.name)
        self.queues[record.name] = record
        for namespace in record.namespaces:
            self.queue_by_namespace.setdefault(namespace, record.name)
        if record.parent:
            self.queue_children.setdefault(record.parent, set()).add(record.name)
        if access_changed and self.managed_mode == "listed":
            self._capacity.namespace_changed(None)
        self._notify("Queue", record.name)

    def delete_queue(self, name: str) -> None:
        self._admitting.clear()
        self._access = None
        self.access_generation += 1
        self._drop_queue_index(name)
        self.queues.pop(name, None)
        if self.managed_mode == "listed":
            self._capacity.namespace_changed(None)
        self._notify("Queue", name)

    def _drop_queue_index(self, name: str) -> None:
        old = self.queues.get(name)
        if old is None:
            return
        siblings = self.queue_children.get(old.parent or "")
        if siblings is not None:
            siblings.discard(name)
            if not siblings:
                del self.queue_children[old.parent or ""]
        for namespace in old.namespaces:
            if self.queue_by_namespace.get(namespace) == name:
                del self.queue_by_namespace[namespace]
                # Another Queue may also list it (the webhook denies that, but
                # objects can predate it): keep the index total.
                for other in self.queues.values():
                    if other.name != name and namespace in other.namespaces:
                        self.queue_by_namespace[namespace] = other.name
                        break

    def upsert_node(self, record: NodeRecord) -> None:
        old = self.nodes.get(record.name)
        self._capacity.count_node(old, -1)
        self.nodes[record.name] = record
        self._capacity.count_node(record, +1)
        if old is None or old.labels != record.labels:
            self.membership.set_node(record)
        self._notify("Node", record.name)

    def delete_node(self, name: str) -> None:
        self._capacity.count_node(self.nodes.pop(name, None), -1)
        self.membership.remove_node(name)
        self._notify("Node", name)

    def upsert_pool(self, record: PoolRecord) -> None:
        self.pools[record.name] = record
        self.membership.set_pool(record)
        self._notify("Pool", record.name)

    def delete_pool(self, name: str) -> None:
        self.pools.pop(name, None)
        self.membership.remove_pool(name)
        self._notify("Pool", name)

    def upsert_pod(self, record: PodRecord) -> None:
        old = self.pods.get(record.uid)
        self._capacity.count_pod(old, -1)
        self._capacity.count_pod(record, +1)
        if old is not None and old.node_name and old.node_name != record.node_name:
            self.pods_by_node[old.node_name].discard(record.uid)
        if old is not None and old.job_uid and old.job_uid != record.job_uid:
            self._forget_job_pod(old, record.uid)
        self.pods[record.uid] = record
        self.owners.put(record.uid, "Pod", record.uid, record.namespace,
                        record.owner_kind, record.owner_uid)
        self.pod_uid_by_name[f"{record.namespace}/{record.name}"] = record.uid
        if record.job_uid:
            self.pods_by_job[f"{record.namespace}/{record.job_uid}"].add(record.uid)
        if record.node_name:
            self.pods_by_node[record.node_name].add(record.uid)
        self._notify("Pod", record.uid)

    def delete_pod(self, uid: str) -> None:
        old = self.pods.pop(uid, None)
        self._capacity.count_pod(old, -1)
        self.owners.drop(uid)
        if old is not None:
            if old.node_name:
                self.pods_by_node[old.node_name].discard(uid)
            name_key = f"{old.namespace}/{old.name}"
            if self.pod_uid_by_name.get(name_key) == uid:
                del self.pod_uid_by_name[name_key]
            if old.job_uid:
                self._forget_job_pod(old, uid)
        self._notify("Pod", uid)

    def _forget_job_pod(self, old: PodRecord, pod_uid: str) -> None:
        key = f"{old.namespace}/{old.job_uid}"
        pods = self.pods_by_job.get(key)
        if pods is not None:
            pods.discard(pod_uid)
            if not pods:
                del self.pods_by_job[key]

    def active_job_pods(self, namespace: str, job_uid: str) -> int:
        """How many of the Job's pods are active as its controller counts
        them: neither finished nor terminating. O(the Job's pods)."""
        count = 0
        for uid in self.pods_by_job.get(f"{namespace}/{job_uid}", ()):
            pod = self.pods.get(uid)
            if pod is not None and not pod.terminating \
                    and pod.phase not in ("Succeeded", "Failed"):
                count += 1
        return count

    def job_pods_started(self, namespace: str, job_uid: str, since: float) -> bool:
        """Whether a pod the Job made at `since` or later is bound to a node (a
        pod that ran, or ran to its end, was): its work started, whatever the
        Job's status says (its controller may be minutes behind its pods).
        O(the Job's pods)."""
        for uid in self.pods_by_job.get(f"{namespace}/{job_uid}", ()):
            pod = self.pods.get(uid)
            if pod is not None and pod.created >= since and pod.node_name:
                return True
        return False

    def apply(self, kind: Kind, event_type: EventType, obj: Mapping[str, Any]) -> None:
        """Apply one watch event given as the raw object.

        An object that cannot be converted (any error: a bad quantity, a
        field of the wrong shape) is logged and skipped, keeping what the
        store had; it never stops the watch that delivered it."""
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        name = str(meta.get("name", ""))
        key = f"{meta.get('namespace', '')}/{name}" if kind in NAMESPACED_KINDS else name
        if event_type == "DELETED":
            self._delete(kind, key, str(meta.get("uid", "")))
            return
        try:
            record = _CONVERTERS[kind](obj)
        except Exception as error:  # one bad object, not a failed watch
            reason = " ".join(str(error).split())[:300] or type(error).__name__
            log.warning("skipping %s %s: %s", kind, key, reason)
            return
        if kind == "Queue":
            self.upsert_queue(record)
        elif kind == "Pod":
            self.upsert_pod(record)
        elif kind == "Node":
            self.upsert_node(record)
        elif kind == "Pool":
            self.upsert_pool(record)
        else:
            self._put_record(kind, key, record)
            self._notify(kind, key)

    # The same dispatch as apply's upsert, one verb per kind: explicit calls keep
    # each kind's typed method visible to mypy (a table of bound methods would not).
    def _delete(self, kind: Kind, key: str, uid: str) -> None:
        if kind == "Queue":
            self.delete_queue(key)
        elif kind == "Pod":
            self.delete_pod(uid)
        elif kind == "Node":
            self.delete_node(key)
        elif kind == "Pool":
            self.delete_pool(key)
        else:
            self._put_record(kind, key, None)
            self._notify(kind, key)

    def _put_record(self, kind: Kind, key: str, record: Any) -> None:
        table = self.table(kind)
        if kind == "QueueUnit":
            self._index_unit(key, table.get(key), record)
        elif kind == "Namespace":
            self._admitting.pop(key, None)
            self._put(table, key, record)
            self._capacity.namespace_changed(key)
            return
        elif kind == "Job" or kind in WORKLOAD_KINDS:
            old = table.get(key)
            if old is not None:
                self.owners.drop(old.uid)
            if record is not None:
                self.owners.put(record.uid, kind, key, record.namespace,
                                record.owner_kind, record.owner_uid)
            if kind in WORKLOAD_KINDS:  # units a child spells out (a TrainJob's JobSet)
                record = follow_child(self.workloads, kind, key, record, old, self._notify)
        self._put(table, key, record)

    def _index_unit(self, key: str, old: UnitRecord | None, new: UnitRecord | None) -> None:
        if (old is None) != (new is None):
            namespace = key.partition("/")[0]
            count = self.units_per_namespace.get(namespace, 0) + (1 if new is not None else -1)
            if count:
                self.units_per_namespace[namespace] = count
            else:
                self.units_per_namespace.pop(namespace, None)
        old_uid = old.consumer.uid if old is not None and old.consumer is not None else ""
        new_uid = new.consumer.uid if new is not None and new.consumer is not None else ""
        if old_uid and old_uid != new_uid and self.unit_by_consumer_uid.get(old_uid) == key:
            del self.unit_by_consumer_uid[old_uid]
        if new_uid:
            self.unit_by_consumer_uid[new_uid] = key

    def root_workload(self, namespace: str, kind: str, uid: str) -> WorkloadRecord | None:
        """The held workload an object's controller chain reaches: follow the
        controller reference (kind, uid) up, by uid at every step, and return
        the topmost workload of an integration switched on that holds it (it
        carries a queue). None when the chain reaches none: the object is
        its own (a plain pod, a Job, a per-pod Deployment's pod)."""
        on = held_kinds(self.integrations)
        for link_kind, key in reversed(self.owners.chain(namespace, kind, uid)):
            if link_kind in on:
                record = self.workloads[link_kind].get(key)
                if record is not None and record.queue is not None:
                    return record
        return None

    def owner_pending(self, kind: str, uid: str) -> bool:
        """The controller reference names a kind an integration holds, but
        no such object is known by that uid (not seen yet: watches of
        different kinds deliver in any order). Its child waits rather than
        being queued as its own work; a forged reference only keeps a
        tenant's own object waiting."""
        return bool(uid) and kind in held_kinds(self.integrations) \
            and uid not in self.owners.links

    def workload_unit(self, workload: WorkloadRecord, suffix: str = "") -> UnitRecord | None:
        """The unit standing for one of the workload's units: found by name,
        kept only when its consumer is this workload (by uid)."""
        unit = self.units.get(workload.unit_key(suffix))
        if unit is None or unit.consumer is None or unit.consumer.uid != workload.uid:
            return None
        return unit

    def workload_pods(self, workload: WorkloadRecord, limit: int = 100_000) -> list[PodRecord]:
        """The pods below the workload on controller chains (by uid)."""
        pods = (self.pods.get(uid) for uid in self.owners.descendants(workload.uid, limit))
        return [pod for pod in pods if pod is not None and pod.namespace == workload.namespace]

    def unit_for_consumer(self, namespace: str, uid: str) -> UnitRecord | None:
        """The unit standing for the consumer of this uid in `namespace`."""
        key = self.unit_by_consumer_uid.get(uid) if uid else None
        if key is None or key.partition("/")[0] != namespace:
            return None
        return self.units.get(key)

    @staticmethod
    def _put(table: dict[str, Any], key: str, record: Any) -> None:
        if record is None:
            table.pop(key, None)
        else:
            table[key] = record

    def table(self, kind: Kind) -> dict[str, Any]:
        """The table holding `kind`'s records, keyed by `store_key`."""
        tables: dict[Kind, dict[str, Any]] = {
            "Queue": self.queues, "Namespace": self.namespaces, "Node": self.nodes,
            "Pod": self.pods, "Job": self.jobs, "QueueUnit": self.units,
            "PriorityClass": self.priority_classes,
            "JobFlow": self.jobflows, "JobTemplate": self.jobtemplates,
            "Pool": self.pools, "AdmissionCheck": self.admission_checks,
            "RuntimeClass": self.runtime_classes,
        }
        return tables[kind] if kind in tables else self.workloads[kind]

    def replace_all(self, kind: Kind, objects: Iterable[Mapping[str, Any]]) -> None:
        """A fresh LIST: drop what is gone, apply what is there."""
        objects = list(objects)
        present = {store_key(kind, o) for o in objects}
        table = self.table(kind)
        for key in [k for k in table if k not in present]:
            self._delete(kind, key, key)  # a Pod's key is its uid
        for obj in objects:
            self.apply(kind, "ADDED", obj)
        self.synced_kinds.add(kind)
