"""AdmissionReview wire types, parsing and rendering (admission.k8s.io/v1).

Parsing checks the envelope only: a body that is not a v1 AdmissionReview
with a request, a uid, an operation and the expected kind raises
`MalformedReview`, which the HTTP adapter answers with 400 and the one-line
reason. What the object itself says is the business of the per-kind
decision modules.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, NotRequired, TypedDict, TypeGuard, cast

import orjson

from arbiter.base.httpserve import one_line
from arbiter.cache.changes import ChangeWaiter
from arbiter.cache.store import ClusterStore, Kind
from arbiter.core.jsonvalues import brief

ADMISSION_API_VERSION = "admission.k8s.io/v1"
REVIEW_KIND = "AdmissionReview"

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
OPERATIONS: frozenset[str] = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
# How kubelets authenticate (the Node authorizer's identities).
NODE_USER_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"
Obj = dict[str, Any]


# -- wire types (what the apiserver sends and expects) ----------------------
class GroupVersionKindWire(TypedDict):
    group: str
    version: str
    kind: str


class UserInfoWire(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class AdmissionRequestWire(TypedDict, total=False):
    uid: str
    kind: GroupVersionKindWire
    resource: dict[str, str]
    subResource: str
    requestKind: GroupVersionKindWire
    requestResource: dict[str, str]
    requestSubResource: str
    name: str
    namespace: str
    operation: Operation
    userInfo: UserInfoWire
    object: Obj | None
    oldObject: Obj | None
    dryRun: bool
    options: Obj | None


class StatusWire(TypedDict):
    code: int
    message: str


class PatchOp(TypedDict):
    op: Literal["add", "remove", "replace", "test"]
    path: str
    value: NotRequired[Any]


class AdmissionResponseWire(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[StatusWire]
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str]
    warnings: NotRequired[list[str]]


class AdmissionReviewWire(TypedDict):
    apiVersion: str
    kind: str
    response: AdmissionResponseWire


# -- parsed request and decision --------------------------------------------
class MalformedReview(ValueError):
    """The body is not an AdmissionReview we can answer; str() is one line."""


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    uid: str
    group: str
    version: str
    kind: str
    operation: Operation
    namespace: str
    name: str
    username: str
    object: Obj | None
    old_object: Obj | None
    dry_run: bool = False
    # "status" for a write to the status subresource, else "".
    sub_resource: str = ""
    groups: tuple[str, ...] = ()

    def is_node(self) -> bool:
        """Whether a kubelet sent it (the node authorizer's identities)."""
        return self.username.startswith(NODE_USER_PREFIX) or NODES_GROUP in self.groups


@dataclass(frozen=True, slots=True)
class AdmissionEnv:
    """What decisions may read: the in-memory cache and arbiter's own identity."""

    store: ClusterStore
    # Usernames arbiter itself authenticates as (a live view: the server
    # learns them at startup).
    own_usernames: Set[str] = frozenset()
    # Per-namespace limits (webhook.limits): resource names a unit may
    # request, QueueUnits a namespace may hold before new work is denied.
    max_resource_names: int = 16
    max_units_per_namespace: int = 10_000
    # Admission at creation (DESIGN §16): while this replica leads, the
    # loop's answer for a Job being created (namespace, name, queue, the
    # object): JSON Patch ops that let it through admitted, or None (held).
    admit_on_create: Callable[[str, str, str, Obj], list[dict[str, Any]] | None] | None = None
    # The key of arbiter's fast-path tokens (arbiter.core.fastpath); None: none is trusted.
    fast_path_key: bytes | None = None
    # Wakes a decision denied only because this replica's watch is behind
    # (`Decision.recheck`); None: such a denial is answered at once.
    changes: ChangeWaiter | None = None
    # How long one review may wait for that record, all rechecks together:
    # well inside the webhooks' timeoutSeconds (3).
    recheck_within: float = 1.0

    def is_arbiter(self, request: AdmissionRequest) -> bool:
        return request.username in self.own_usernames


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    message: str = ""
    code: int = 200
    patch: tuple[PatchOp, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    # (kind, key) of a record the denial rests on that this replica's
    # watch may not have delivered yet: decided again when it changes.
    recheck: tuple[Kind, str] | None = None


ALLOW = Decision(allowed=True)


def allow(patch: list[PatchOp] | None = None, warnings: list[str] | None = None) -> Decision:
    if not patch and not warnings:
        return ALLOW
    return Decision(allowed=True, patch=tuple(patch or ()), warnings=tuple(warnings or ()))


def deny(message: str, code: int = 403, warnings: list[str] | None = None,
         recheck: tuple[Kind, str] | None = None) -> Decision:
    return Decision(allowed=False, message=one_line(message), code=code,
                    warnings=tuple(warnings or ()), recheck=recheck)


# -- envelope ----------------------------------------------------------------
def _text(value: object, where: str, *, required: bool = False) -> str:
    if value is None:
        if required:
            raise MalformedReview(f"{where} is missing")
        return ""
    if not isinstance(value, str):
        raise MalformedReview(f"{where} must be a string")
    if required and not value:
        raise MalformedReview(f"{where} is empty")
    return value


def _object(value: object, where: str) -> Obj | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise MalformedReview(f"{where} must be an object")
    return cast(Obj, value)


def parse_review(body: bytes, expected_group: str, expected_kind: str) -> AdmissionRequest:
    """Parse and check an AdmissionReview request body."""
    if not body:
        raise MalformedReview("empty body: expected an AdmissionReview")
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise MalformedReview(f"body is not valid JSON: {error}") from None
    if not isinstance(review, dict):
        raise MalformedReview("body must be a JSON object (an AdmissionReview)")
    if review.get("apiVersion") != ADMISSION_API_VERSION:
        raise MalformedReview(
            f"apiVersion must be {ADMISSION_API_VERSION}, got {brief(review.get('apiVersion'), 80)}"
        )
    if review.get("kind") != REVIEW_KIND:
        raise MalformedReview(f"kind must be {REVIEW_KIND}, got {brief(review.get('kind'), 80)}")
    request = review.get("request")
    if request is None:
        raise MalformedReview("request is missing")
    if not isinstance(request, dict):
        raise MalformedReview("request must be an object")
    uid = _text(request.get("uid"), "request.uid", required=True)
    gvk = request.get("kind")
    if not isinstance(gvk, dict):
        raise MalformedReview("request.kind must be an object {group, version, kind}")
    group = _text(gvk.get("group"), "request.kind.group")
    kind = _text(gvk.get("kind"), "request.kind.kind", required=True)
    version = _text(gvk.get("version"), "request.kind.version")
    if group != expected_group or kind != expected_kind:
        expected = f"{expected_group}/{expected_kind}".lstrip("/")
        raise MalformedReview(f"this endpoint reviews {expected}, got {group}/{kind}".replace(
            " /", " "))
    operation = _text(request.get("operation"), "request.operation", required=True)
    if operation not in OPERATIONS:
        raise MalformedReview(f"request.operation {brief(operation)} is not one of "
                              "CREATE, UPDATE, DELETE, CONNECT")
    user = request.get("userInfo")
    username, groups = "", tuple[str, ...]()
    if isinstance(user, dict):
        username = _text(user.get("username"), "request.userInfo.username")
        groups = _groups(user.get("groups"))
    elif user is not None:
        raise MalformedReview("request.userInfo must be an object")
    dry_run = request.get("dryRun", False)
    if dry_run is not None and not isinstance(dry_run, bool):
        raise MalformedReview("request.dryRun must be a boolean")
    return AdmissionRequest(
        uid=uid,
        group=group,
        version=version,
        kind=kind,
        operation=cast(Operation, operation),
        namespace=_text(request.get("namespace"), "request.namespace"),
        name=_text(request.get("name"), "request.name"),
        username=username,
        object=_object(request.get("object"), "request.object"),
        old_object=_object(request.get("oldObject"), "request.oldObject"),
        dry_run=bool(dry_run),
        sub_resource=_text(request.get("subResource"), "request.subResource"),
        groups=groups,
    )


def _groups(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
        raise MalformedReview("request.userInfo.groups must be a list of strings")
    return tuple(value)


def render(uid: str, decision: Decision, *, mutating: bool) -> bytes:
    """The AdmissionReview response body; a patch only from a mutating webhook."""
    response: AdmissionResponseWire = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": decision.code, "message": decision.message}
    elif mutating and decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(list(decision.patch))).decode()
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    review: AdmissionReviewWire = {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": REVIEW_KIND,
        "response": response,
    }
    return orjson.dumps(review)


# -- typed access to the reviewed object ------------------------------------
def get_map(obj: Mapping[str, Any], key: str, where: str) -> Obj | None:
    """obj[key] as a dict, None when absent or null; MalformedReview otherwise."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise MalformedReview(f"{where} must be an object")
    return cast(Obj, value)


def get_list(obj: Mapping[str, Any], key: str, where: str) -> list[Any] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise MalformedReview(f"{where} must be a list")
    return value


def get_labels(meta: Mapping[str, Any] | None, where: str) -> dict[str, str] | None:
    """metadata.labels as str -> str; None when absent."""
    if meta is None:
        return None
    labels = get_map(meta, "labels", f"{where}.labels")
    if labels is None:
        return None
    for key, value in labels.items():
        if not isinstance(value, str):
            raise MalformedReview(f"{where}.labels[{brief(key, 60)}] must be a string")
    return cast(dict[str, str], labels)


def text_field(obj: Mapping[str, Any] | None, key: str, default: str = "") -> str:
    """obj[key] when it is a non-empty string, else `default` (never str() of a
    user value: that recurses through nesting)."""
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, str) and value else default


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer (a bool is not one, though Python says so)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_object(request: AdmissionRequest, *, old: bool = False) -> Obj:
    value = request.old_object if old else request.object
    if value is None:
        raise MalformedReview(
            f"request.{'oldObject' if old else 'object'} is missing for {request.operation}"
        )
    return value


def get_metadata(obj: Mapping[str, Any],
                 where: str) -> tuple[Obj | None, dict[str, str] | None]:
    """(metadata, metadata.labels) of the object at `where`; each None when absent."""
    meta = get_map(obj, "metadata", f"{where}.metadata")
    return meta, get_labels(meta, f"{where}.metadata")


class Namespaced(NamedTuple):
    """A namespaced object under review, with what every decision reads first."""

    obj: Obj
    meta: Obj | None
    labels: dict[str, str] | None
    namespace: str


def namespaced_object(request: AdmissionRequest, kind: str, *, old: bool = False) -> Namespaced:
    """The reviewed object (or old object) of a namespaced `kind`: its metadata,
    labels and namespace (the request's, else metadata.namespace)."""
    obj = require_object(request, old=old)
    meta, labels = get_metadata(obj, "request.oldObject" if old else "request.object")
    namespace = request.namespace
    if not namespace and meta is not None and isinstance(meta.get("namespace"), str):
        namespace = meta["namespace"]
    if not namespace:
        raise MalformedReview(f"request.namespace is missing for a namespaced {kind}")
    return Namespaced(obj, meta, labels, namespace)
