"""kube-scheduler's extender wire format (k8s.io/kube-scheduler/extender/v1).

kube-scheduler marshals its Go structs with `encoding/json`, so the
envelope's keys are the capitalised Go field names (`Pod`, `NodeNames`,
`NodeNameToMetaVictims`, ...) and a field that is not set arrives as
`null`. Go reads them back case-insensitively; so do we. Unlike Go we refuse
unknown envelope fields and wrong types with `BadRequest`: the HTTP layer
answers 400 with the message, which is always one line.

The Kubernetes objects inside the envelope (the Pod, Node items, victim
Pods) are read as the apiserver writes them (camelCase keys, exact); only
the fields arbiter's decisions use are checked, and only for their shape.
The pod is turned into a `PodRecord` by the same converter the cache uses,
so a pod looks the same to the extender whether it came over the wire or
through a watch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from arbiter.cache import convert
from arbiter.cache.records import PodRecord
from arbiter.core.quantities import QuantityError

MIN_SCORE = 0  # extenderv1.MinExtenderPriority
MAX_SCORE = 10  # extenderv1.MaxExtenderPriority


class BadRequest(ValueError):
    """A request the extender cannot act on; str() is a one-line reason for HTTP 400."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


# -- answers: exactly the keys Go marshals ------------------------------------
class NodeList(TypedDict):
    apiVersion: str
    kind: str
    items: list[Mapping[str, Any]]


class ExtenderFilterResult(TypedDict):
    Nodes: NodeList | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    Host: str
    Score: int


HostPriorityList = list[HostPriority]


class MetaPod(TypedDict):
    UID: str


class MetaVictims(TypedDict):
    Pods: list[MetaPod]
    NumPDBViolations: int


class ExtenderPreemptionResult(TypedDict):
    NodeNameToMetaVictims: dict[str, MetaVictims]


# -- requests, parsed ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """The body of filter and prioritize calls."""

    pod: PodRecord
    # Candidate node names in the scheduler's order (from NodeNames, or the
    # names of the Nodes items).
    names: list[str]
    # The full Node objects and their labels when the scheduler sent `Nodes`
    # (an extender that is not nodeCacheCapable); None when it sent NodeNames.
    nodes: list[Mapping[str, Any]] | None = None
    node_labels: list[Mapping[str, str]] | None = None

    @property
    def node_cache_capable(self) -> bool:
        return self.nodes is None


@dataclass(frozen=True, slots=True)
class Victim:
    uid: str
    # The whole pod when the scheduler sent NodeNameToVictims; None for
    # NodeNameToMetaVictims (UIDs only: look the pod up in the cache).
    pod: PodRecord | None = None


@dataclass(frozen=True, slots=True)
class NodeVictims:
    pods: tuple[Victim, ...]
    pdb_violations: int = 0


@dataclass(frozen=True, slots=True)
class ExtenderPreemptionArgs:
    pod: PodRecord
    victims: dict[str, NodeVictims]


# -- reading ---------------------------------------------------------------------
def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _short(key: str) -> str:
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "...'"


def _fields(obj: Any, known: tuple[str, ...], where: str) -> dict[str, Any]:
    """An envelope object's fields by canonical Go name, matched case-insensitively."""
    if not isinstance(obj, dict):
        raise BadRequest(f"{where}: expected an object, got {_kind(obj)}")
    canonical = {name.lower(): name for name in known}
    fields: dict[str, Any] = {}
    for key, value in obj.items():
        name = canonical.get(key.lower())
        if name is None:
            raise BadRequest(
                f"{where}: unknown field {_short(key)} (expected {', '.join(known)})"
            )
        if name in fields:
            raise BadRequest(f"{where}: field {name} is given twice")
        fields[name] = value
    return fields


def _object(value: Any, where: str, *, optional: bool = True) -> dict[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{where}: expected an object, got {_kind(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"{where}: expected an array, got {_kind(value)}")
    return value


def _string(value: Any, where: str, *, required: bool = False) -> str:
    if value is None:
        if required:
            raise BadRequest(f"{where}: required")
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{where}: expected a string, got {_kind(value)}")
    if required and not value:
        raise BadRequest(f"{where}: must not be empty")
    return value


def _int(value: Any, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{where}: expected an integer, got {_kind(value)}")
    return value


def _string_map(value: Any, where: str) -> dict[str, str]:
    mapping = _object(value, where)
    for key, item in mapping.items():
        if not isinstance(item, str):
            raise BadRequest(f"{where}[{_short(key)}]: expected a string, got {_kind(item)}")
    return mapping


def _check_containers(value: Any, where: str) -> None:
    for index, container in enumerate(_list(value, where)):
        here = f"{where}[{index}]"
        container = _object(container, here, optional=False)
        resources = _object(container.get("resources"), f"{here}.resources")
        for part in ("requests", "limits"):
            _object(resources.get(part), f"{here}.resources.{part}")


def parse_pod(obj: Any, where: str = "Pod", *, require_uid: bool = False) -> PodRecord:
    """Check the shape of the fields arbiter reads, then convert like the cache does."""
    pod = _object(obj, where, optional=False)
    meta = _object(pod.get("metadata"), f"{where}.metadata")
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise BadRequest(
            f"{where}.metadata.namespace: required (got {_kind(namespace)}); "
            "kube-scheduler only places namespaced pods"
        )
    _string(meta.get("name"), f"{where}.metadata.name", required=True)
    _string(meta.get("uid"), f"{where}.metadata.uid", required=require_uid)
    _string(meta.get("creationTimestamp"), f"{where}.metadata.creationTimestamp")
    _string_map(meta.get("labels"), f"{where}.metadata.labels")
    _string_map(meta.get("annotations"), f"{where}.metadata.annotations")
    owners = _list(meta.get("ownerReferences"), f"{where}.metadata.ownerReferences")
    for index, ref in enumerate(owners):
        here = f"{where}.metadata.ownerReferences[{index}]"
        ref = _object(ref, here, optional=False)
        for key in ("kind", "name", "uid"):
            _string(ref.get(key), f"{here}.{key}")
        if ref.get("controller") is not None and not isinstance(ref.get("controller"), bool):
            raise BadRequest(f"{here}.controller: expected a boolean")

    spec = _object(pod.get("spec"), f"{where}.spec")
    _check_containers(spec.get("containers"), f"{where}.spec.containers")
    _check_containers(spec.get("initContainers"), f"{where}.spec.initContainers")
    _object(_object(spec.get("resources"), f"{where}.spec.resources").get("requests"),
            f"{where}.spec.resources.requests")
    _object(spec.get("overhead"), f"{where}.spec.overhead")
    _int(spec.get("priority"), f"{where}.spec.priority")
    _string(spec.get("nodeName"), f"{where}.spec.nodeName")
    _string(spec.get("schedulerName"), f"{where}.spec.schedulerName")
    gates = _list(spec.get("schedulingGates"), f"{where}.spec.schedulingGates")
    for index, gate in enumerate(gates):
        _object(gate, f"{where}.spec.schedulingGates[{index}]", optional=False)
    status = _object(pod.get("status"), f"{where}.status")
    _string(status.get("phase"), f"{where}.status.phase")

    try:
        record = convert.pod_from_api(pod)
    except (convert.ConversionError, QuantityError, ValueError, TypeError) as error:
        raise BadRequest(f"{where}: {error}") from error
    if not record.phase:
        # `phase: null` reads as unset.
        record = replace(record, phase="Pending")
    return record


_EXTENDER_ARGS = ("Pod", "Nodes", "NodeNames")
_PREEMPTION_ARGS = ("Pod", "NodeNameToVictims", "NodeNameToMetaVictims")
_VICTIMS = ("Pods", "NumPDBViolations")
_META_POD = ("UID",)


def parse_extender_args(body: Any) -> ExtenderArgs:
    """ExtenderArgs: `Pod` plus exactly one of `NodeNames` or `Nodes`."""
    fields = _fields(body, _EXTENDER_ARGS, "ExtenderArgs")
    if fields.get("Pod") is None:
        raise BadRequest("ExtenderArgs.Pod: required")
    pod = parse_pod(fields["Pod"])
    raw_names = fields.get("NodeNames")
    raw_nodes = fields.get("Nodes")
    if raw_names is not None and raw_nodes is not None:
        raise BadRequest("ExtenderArgs: both Nodes and NodeNames are set; send exactly one")
    if raw_names is None and raw_nodes is None:
        raise BadRequest("ExtenderArgs: one of NodeNames or Nodes is required")
    if raw_names is not None:
        given = _list(raw_names, "ExtenderArgs.NodeNames")
        # JSON strings decode to exactly `str`: one pass in C over thousands of names.
        if not set(map(type, given)) <= {str}:
            index, name = next((i, n) for i, n in enumerate(given) if not isinstance(n, str))
            raise BadRequest(
                f"ExtenderArgs.NodeNames[{index}]: expected a string, got {_kind(name)}"
            )
        return ExtenderArgs(pod=pod, names=given)
    node_list = _object(raw_nodes, "ExtenderArgs.Nodes", optional=False)
    items = _list(node_list.get("items"), "ExtenderArgs.Nodes.items")
    names: list[str] = []
    labels: list[Mapping[str, str]] = []
    for index, item in enumerate(items):
        where = f"ExtenderArgs.Nodes.items[{index}]"
        node = _object(item, where, optional=False)
        meta = _object(node.get("metadata"), f"{where}.metadata")
        names.append(_string(meta.get("name"), f"{where}.metadata.name", required=True))
        labels.append(_string_map(meta.get("labels"), f"{where}.metadata.labels"))
    return ExtenderArgs(pod=pod, names=names, nodes=items, node_labels=labels)


def _parse_victims(value: Any, where: str, *, meta: bool) -> NodeVictims:
    if value is None:
        return NodeVictims(pods=())
    fields = _fields(value, _VICTIMS, where)
    pods: list[Victim] = []
    for index, item in enumerate(_list(fields.get("Pods"), f"{where}.Pods")):
        here = f"{where}.Pods[{index}]"
        if meta:
            uid = _string(_fields(item, _META_POD, here).get("UID"), f"{here}.UID", required=True)
            pods.append(Victim(uid=uid))
        else:
            record = parse_pod(item, here, require_uid=True)
            pods.append(Victim(uid=record.uid, pod=record))
    violations = _int(fields.get("NumPDBViolations"), f"{where}.NumPDBViolations")
    if violations < 0:
        raise BadRequest(f"{where}.NumPDBViolations: must not be negative")
    return NodeVictims(pods=tuple(pods), pdb_violations=violations)


# Same opening as parse_extender_args (fields, Pod, exactly one of two forms):
# the two wire types say the same thing their own way, so each is parsed in full.
def parse_preemption_args(body: Any) -> ExtenderPreemptionArgs:
    """ExtenderPreemptionArgs: `Pod` plus NodeNameToMetaVictims (nodeCacheCapable)
    or NodeNameToVictims (whole pods)."""
    fields = _fields(body, _PREEMPTION_ARGS, "ExtenderPreemptionArgs")
    if fields.get("Pod") is None:
        raise BadRequest("ExtenderPreemptionArgs.Pod: required")
    pod = parse_pod(fields["Pod"])
    full = fields.get("NodeNameToVictims")
    meta = fields.get("NodeNameToMetaVictims")
    if full is not None and meta is not None:
        raise BadRequest(
            "ExtenderPreemptionArgs: both NodeNameToVictims and NodeNameToMetaVictims are set"
        )
    is_meta = full is None
    field = "NodeNameToMetaVictims" if is_meta else "NodeNameToVictims"
    where = f"ExtenderPreemptionArgs.{field}"
    victims = {
        node: _parse_victims(value, f"{where}[{_short(node)}]", meta=is_meta)
        for node, value in _object(meta if is_meta else full, where).items()
    }
    return ExtenderPreemptionArgs(pod=pod, victims=victims)
