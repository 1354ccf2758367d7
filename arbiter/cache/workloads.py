"""Slim records of the workloads integrations hold (DESIGN §14), and the
owner walk: which held workload an object's controller chain reaches.

A workload is kept as what decisions read: its queue, whether it is
suspended, the units its spec asks for (pod sets with requests, computed
once here), its outcome and readiness, and its controller ownerRef (kind and
uid) so that a child's chain can be followed by uid, step by step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from arbiter.cache.records import PodSet
from arbiter.core.api import QUEUE_LABEL, parse_time, workload_unit_name
from arbiter.core.quantities import QuantityError
from arbiter.integrations import BY_KIND, Integration
from arbiter.integrations.base import Outcome, dig


class WorkloadError(ValueError):
    """The object cannot be read as its kind (logged and skipped by the store)."""


@dataclass(frozen=True, slots=True)
class WorkloadUnit:
    """One unit a workload's spec asks for (`suffix`: "" or a group index)."""

    suffix: str
    pod_sets: tuple[PodSet, ...]


@dataclass(frozen=True, slots=True)
class WorkloadRecord:
    kind: str
    uid: str
    namespace: str
    name: str
    queue: str | None = None
    suspended: bool = False
    # None while the spec is not complete (no unit yet); () when it needs none.
    units: tuple[WorkloadUnit, ...] | None = ()
    priority_class: str | None = None
    outcome: Outcome | None = None
    ready: int = 0
    # Its controller ownerRef (kind, uid): "" when it has none.
    owner_kind: str = ""
    owner_uid: str = ""
    created: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def integration(self) -> Integration:
        return BY_KIND[self.kind]

    def unit_name(self, suffix: str = "") -> str:
        """The QueueUnit of one of its units: `<prefix>-<name>[-<suffix>]`."""
        return workload_unit_name(self.integration.prefix, self.name, suffix)

    def unit_key(self, suffix: str = "") -> str:
        return f"{self.namespace}/{self.unit_name(suffix)}"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def workload_from_api(integration: Integration, obj: Mapping[str, Any]) -> WorkloadRecord:
    meta = _map(obj.get("metadata"))
    labels = _map(meta.get("labels"))
    try:
        specs = integration.units(obj)
    except QuantityError as error:
        raise WorkloadError(str(error)) from error
    units = None if specs is None else tuple(
        WorkloadUnit(spec.suffix, tuple(PodSet(ps.name, ps.count, ps.requests)
                                        for ps in spec.pod_sets))
        for spec in specs)
    owner_kind = owner_uid = ""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            owner_kind, owner_uid = str(ref.get("kind") or ""), str(ref.get("uid") or "")
            break
    templates = integration.templates(obj)
    priority_class = dig(obj, (*templates[0], "spec", "priorityClassName")) if templates else None
    # One the kind does not hold (a RayJob on an existing cluster) is no
    # queue's, whatever its label says: no unit, and no held root for its children.
    queue = labels.get(QUEUE_LABEL) if integration.holds(obj) else None
    return WorkloadRecord(
        kind=integration.kind,
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        queue=queue if isinstance(queue, str) and queue else None,
        suspended=integration.suspended(obj),
        units=units,
        priority_class=priority_class if isinstance(priority_class, str) and priority_class
        else None,
        outcome=integration.outcome(obj),
        ready=integration.ready(obj),
        owner_kind=owner_kind,
        owner_uid=owner_uid,
        created=parse_time(meta.get("creationTimestamp")),
    )


def with_child_units(parent: WorkloadRecord, child: WorkloadRecord | None,
                     old: WorkloadRecord | None = None) -> WorkloadRecord:
    """`parent` (a kind whose units its child spells out: `Integration.units_from`)
    with the units and priority class of `child`: the one its controller
    makes, same namespace and name, controlled by `parent` by uid (a child
    another object controls, or a forged one, counts for nothing). With no
    such child, the units last read (`old`, the same uid): a JobSet deleted
    and made again must not drop an admitted unit in between; none before."""
    if child is not None and child.owner_kind == parent.kind and child.owner_uid == parent.uid \
            and child.namespace == parent.namespace:
        return replace(parent, units=child.units, priority_class=child.priority_class)
    if old is not None and old.uid == parent.uid:
        return replace(parent, units=old.units, priority_class=old.priority_class)
    return replace(parent, units=None)


def follow_child(tables: Mapping[str, dict[str, WorkloadRecord]], kind: str, key: str,
                 record: WorkloadRecord | None, old: WorkloadRecord | None,
                 notify: Callable[[Any, str], None]) -> WorkloadRecord | None:
    """Units read from a child (`Integration.units_from`), kept as records
    arrive in any order: `record` (about to be filed under `key`, replacing
    `old`) with its child's units when its kind reads them there; and when
    it is such a child, its parent of the same key (in `tables`) updated in
    place and `notify`-ed, so the loop looks at the parent again."""
    source = BY_KIND[kind].units_from
    if record is not None and source:
        return with_child_units(record, tables[source].get(key), old)
    for parent_kind, parents in tables.items():
        parent = parents.get(key) if BY_KIND[parent_kind].units_from == kind else None
        if parent is not None and record is not None:
            updated = with_child_units(parent, record, parent)
            if updated != parent:
                parents[key] = updated
                notify(parent_kind, key)
    return record


# Controller chains are short (LWS: pod -> StatefulSet -> pod -> StatefulSet
# -> LWS); a longer one is not followed (and a cycle of forged refs ends).
MAX_CHAIN = 6


@dataclass(slots=True)
class OwnerIndex:
    """Who controls whom, by uid: each object's controller (kind, uid) and
    each controller's children, for Jobs, workloads and pods."""

    # uid -> (kind, store key, namespace, controller kind, controller uid)
    links: dict[str, tuple[str, str, str, str, str]]
    children: dict[str, set[str]]

    @classmethod
    def empty(cls) -> OwnerIndex:
        return cls({}, {})

    def put(self, uid: str, kind: str, key: str, namespace: str,
            owner_kind: str, owner_uid: str) -> None:
        if not uid:
            return
        self.drop(uid)
        self.links[uid] = (kind, key, namespace, owner_kind, owner_uid)
        if owner_uid:
            self.children.setdefault(owner_uid, set()).add(uid)

    def drop(self, uid: str) -> None:
        old = self.links.pop(uid, None)
        if old is not None and old[4]:
            siblings = self.children.get(old[4])
            if siblings is not None:
                siblings.discard(uid)
                if not siblings:
                    del self.children[old[4]]

    def chain(self, namespace: str, kind: str, uid: str) -> list[tuple[str, str]]:
        """(kind, key) of every object on the controller chain from the
        reference (kind, uid) up, as far as each step is known with that
        kind, in `namespace` (the reference's own object first)."""
        found: list[tuple[str, str]] = []
        seen: set[str] = set()
        for _ in range(MAX_CHAIN):
            link = self.links.get(uid) if uid and uid not in seen else None
            if link is None or link[0] != kind or link[2] != namespace:
                break
            seen.add(uid)
            found.append((link[0], link[1]))
            kind, uid = link[3], link[4]
        return found

    def _child_of(self, child: str, parent: str) -> bool:
        link, above = self.links.get(child), self.links.get(parent)
        return link is not None and above is not None and link[3] == above[0] \
            and link[2] == above[2]

    def descendants(self, uid: str, limit: int = 100_000) -> list[str]:
        """uids below `uid` (children, their children, ...), at most `limit`,
        each once (a cycle of forged refs neither repeats one nor returns `uid`).
        A child counts only when its reference names its parent's kind and
        namespace, as `chain` checks them (a pod naming a RayJob's uid as a
        RayCluster's is not the RayJob's)."""
        out: list[str] = []
        seen = {uid}
        frontier = [uid]
        for _ in range(MAX_CHAIN):
            nxt = [c for parent in frontier for c in self.children.get(parent, ())
                   if c not in seen and self._child_of(c, parent)]
            seen.update(nxt)
            out.extend(nxt)
            if not nxt or len(out) >= limit:
                break
            frontier = nxt
        return out[:limit]
