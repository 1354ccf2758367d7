"""Integrations declared in a file (`arbiter serve --integration-file`), not
coded: a custom resource arbiter holds by a boolean suspend field, whose pod
sets are each a count and a pod template at declared paths (DESIGN §14).

    integrations:
    - group: example.com
      version: v1
      kind: Widget
      resource: widgets
      suspendPath: spec.suspend
      podSets:
      - {name: driver, countPath: spec.driver.replicas, templatePath: spec.driver.template}
      - {name: workers, countPath: spec.workers.count, templatePath: spec.workers.template}
      finishedConditions: [Complete]     # optional: status condition types
      failedConditions: [Failed]         # optional
      readyPath: status.readyReplicas    # optional: else running once a pod is bound
      prefix: widget                     # optional: unit names widget-<name>

A pod set's count and template may run over one list (`spec.groups[*].replicas`
and `spec.groups[*].template`): a pod set per element, `<name>-<index>`.

Parsing is strict: an unknown key, a missing or malformed field, a kind or
resource declared twice or already an integration's is refused with the
field named (`integrations[1].podSets[0].countPath: ...`); the schema check
against the CRD is `declared_schema`. Pure: the caller reads the file.

A declared kind is one unit of all its pod sets (a gang, admitted whole);
its controller must create no pod while the suspend field is true and
delete its pods when it turns true again (as a Job's or a JobSet's does).
Its pods must name it (or a child it controls) as their controller.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from arbiter.core.api import MAX_POD_SETS
from arbiter.integrations.base import (
    Integration,
    Obj,
    Outcome,
    Path,
    PodSetSpec,
    UnitSpec,
    condition_true,
    dig,
    template_requests,
    whole,
)

_FIELDS = {"group", "version", "kind", "resource", "suspendPath", "podSets", "prefix",
           "finishedConditions", "failedConditions", "readyPath"}
_REQUIRED = ("group", "version", "kind", "resource", "suspendPath", "podSets")
_POD_SET_FIELDS = {"name", "countPath", "templatePath"}
_SEGMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# The step `[*]` stands for in a parsed path: every element of the list there.
EVERY = "*"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+")
_KIND = re.compile(r"[A-Z][A-Za-z0-9]*")
_VERSION = re.compile(r"v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?")
# A unit is named <prefix>-<workload name>: the prefix leaves room for it.
MAX_PREFIX = 20
FILE_HEADER = {"apiVersion": "arbiter.dev/v1alpha1", "kind": "IntegrationFile"}


class DeclarationError(ValueError):
    """A declaration refused, with the field that is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class DeclaredPodSet:
    name: str
    count: Path
    template: Path


@dataclass(frozen=True, slots=True)
class Declaration:
    """One declared kind, as read from the file; `field` is where
    (`integrations[0]`), for the messages of later checks."""

    field: str
    group: str
    version: str
    kind: str
    resource: str
    suspend: Path
    pod_sets: tuple[DeclaredPodSet, ...]
    prefix: str
    finished: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    ready: Path | None = None

    @property
    def gvk(self) -> str:
        return f"{self.group}/{self.version} {self.kind}"


def path_text(path: Path) -> str:
    return ".".join(map(str, path)).replace(f".{EVERY}", "[*]")


def parse_path(text: Any, field: str, *, lists: bool = False) -> Path:
    """`spec.driver.replicas` -> ("spec", "driver", "replicas"): dot-separated
    field names under spec (or status); with `lists`, one field may end in
    `[*]` (every element of that list: `spec.groups[*].replicas` ->
    ("spec", "groups", EVERY, "replicas"))."""
    if not isinstance(text, str) or not text:
        raise DeclarationError(field, "must be a dotted path such as spec.workers.replicas")
    steps: list[str] = []
    for step in text.split("."):
        name = step.removesuffix("[*]")
        if not _SEGMENT.fullmatch(name) or (name != step and (not lists or EVERY in steps)):
            raise DeclarationError(field, f"{text!r}: {step!r} is not a field name (letters, "
                                   "digits, _ and -" + ("; one list as name[*]" if lists else "")
                                   + "; no list indexes)")
        steps.extend((name, EVERY) if name != step else (name,))
    if steps[0] not in ("spec", "status") or len(steps) < 2 or steps[-1] == EVERY:
        raise DeclarationError(field, f"{text!r} must name a field under spec (or status)")
    return tuple(steps)


def list_part(path: Path) -> Path:
    """The path of the list a `[*]` path runs over (() when it has none)."""
    return path[: path.index(EVERY)] if EVERY in path else ()


def _text(entry: Mapping[str, Any], key: str, field: str, pattern: re.Pattern[str],
          what: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise DeclarationError(f"{field}.{key}", f"must be {what}, got {value!r}")
    return value


def _keys(entry: Any, field: str, known: Collection[str], required: Collection[str]) -> None:
    if not isinstance(entry, Mapping):
        raise DeclarationError(field, "must be a mapping")
    unknown = sorted(set(entry) - set(known), key=str)
    if unknown:
        raise DeclarationError(f"{field}.{unknown[0]}",
                               f"unknown field (known: {', '.join(sorted(known))})")
    missing = [key for key in required if key not in entry]
    if missing:
        raise DeclarationError(f"{field}.{missing[0]}", "is required")


def _conditions(entry: Mapping[str, Any], key: str, field: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DeclarationError(f"{field}.{key}", "must be a list of condition types")
    return tuple(value)


def _pod_sets(entry: Mapping[str, Any], field: str) -> tuple[DeclaredPodSet, ...]:
    items = entry["podSets"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_POD_SETS:
        raise DeclarationError(f"{field}.podSets", f"must list 1 to {MAX_POD_SETS} pod sets")
    found: list[DeclaredPodSet] = []
    for index, item in enumerate(items):
        where = f"{field}.podSets[{index}]"
        _keys(item, where, _POD_SET_FIELDS, tuple(sorted(_POD_SET_FIELDS)))
        name = _text(item, "name", where, _DNS_LABEL, "a DNS label (lower case)")
        if any(p.name == name for p in found):
            raise DeclarationError(f"{where}.name", f"{name!r} names another pod set too")
        count = parse_path(item["countPath"], f"{where}.countPath", lists=True)
        template = parse_path(item["templatePath"], f"{where}.templatePath", lists=True)
        if list_part(count) != list_part(template):
            raise DeclarationError(f"{where}.templatePath", "a pod set per list element needs "
                                   "its count and its template in the same list "
                                   f"({path_text(list_part(count) or ('spec',))}[*]...)")
        for other in found:
            if template == other.template:
                raise DeclarationError(f"{where}.templatePath",
                                       f"{item['templatePath']!r} is pod set "
                                       f"{other.name!r}'s template too")
        found.append(DeclaredPodSet(name, count, template))
    return tuple(found)


def _declaration(entry: Any, field: str) -> Declaration:
    _keys(entry, field, _FIELDS, _REQUIRED)
    kind = _text(entry, "kind", field, _KIND, "a kind in CamelCase (Widget)")
    prefix = entry.get("prefix", kind.lower())
    if not isinstance(prefix, str) or not _DNS_LABEL.fullmatch(prefix) \
            or len(prefix) > MAX_PREFIX:
        raise DeclarationError(f"{field}.prefix", f"must be a DNS label of at most {MAX_PREFIX} "
                               f"characters, got {prefix!r}")
    ready = entry.get("readyPath")
    return Declaration(
        field=field,
        group=_text(entry, "group", field, _DNS_NAME,
                    "an API group with a dot (example.com); a core kind cannot be declared"),
        version=_text(entry, "version", field, _VERSION, "a version such as v1 or v1beta2"),
        kind=kind,
        resource=_text(entry, "resource", field, _DNS_LABEL, "the plural resource (widgets)"),
        suspend=parse_path(entry["suspendPath"], f"{field}.suspendPath"),
        pod_sets=_pod_sets(entry, field),
        prefix=prefix,
        finished=_conditions(entry, "finishedConditions", field),
        failed=_conditions(entry, "failedConditions", field),
        ready=None if ready is None else parse_path(ready, f"{field}.readyPath"),
    )


def parse(doc: Any, builtin: Iterable[Integration],
          reserved: Collection[str] = ()) -> tuple[Declaration, ...]:
    """The declarations of a loaded file (`{"integrations": [...]}`).
    `builtin`: the integrations arbiter has, `reserved`: the other kinds its
    cache files: a declared kind may be none of them, in any group (the
    cache files workloads by kind). Raises DeclarationError."""
    taken = {i.kind: i for i in builtin}
    _keys(doc, "file", {"integrations", *FILE_HEADER}, ("integrations",))
    for key, value in FILE_HEADER.items():
        if key in doc and doc[key] != value:
            raise DeclarationError(key, f"must be {value!r}")
    items = doc["integrations"]
    if not isinstance(items, list):
        raise DeclarationError("integrations", "must be a list")
    found: list[Declaration] = []
    prefixes = {i.prefix: i.kind for i in taken.values() if i.prefix}
    prefixes.update({"job": "Job", "pod": "Pod", "group": "PodGroup"})
    for index, entry in enumerate(items):
        decl = _declaration(entry, f"integrations[{index}]")
        for other in found:
            if (other.group, other.resource) == (decl.group, decl.resource):
                raise DeclarationError(f"{decl.field}.resource",
                                       f"{decl.resource}.{decl.group} is declared twice")
            if other.kind == decl.kind:
                raise DeclarationError(f"{decl.field}.kind", f"{decl.kind} is declared twice "
                                       "(kinds must differ, whatever their group)")
        known = taken.get(decl.kind)
        if known is not None or decl.kind in reserved:
            owner = f"{known.group or 'core'}/{known.version}" if known else "arbiter's own"
            raise DeclarationError(f"{decl.field}.kind",
                                   f"{decl.kind} is already known to arbiter ({owner}); "
                                   "a declared kind's name must differ, whatever its group")
        clash = prefixes.get(decl.prefix) or next(
            (d.kind for d in found if d.prefix == decl.prefix), None)
        if clash is not None:
            raise DeclarationError(f"{decl.field}.prefix",
                                   f"{decl.prefix!r} is {clash}'s unit prefix already")
        found.append(decl)
    return tuple(found)


class DeclaredIntegration(Integration):
    """A declared kind: one gang unit of its pod sets, held by its suspend
    field, placed into its pod templates."""

    def __init__(self, decl: Declaration) -> None:
        self.decl = decl
        # Its CRD's name, and its endpoints' and hooks' (a declared plural
        # may be a built-in kind's too: the group tells them apart).
        self.name = f"{decl.resource}.{decl.group}"
        self.group, self.version, self.resource = decl.group, decl.version, decl.resource
        self.kind, self.prefix = decl.kind, decl.prefix
        self.suspend_path = decl.suspend
        self.readable = " and ".join(
            f"{path_text(p.count)} a whole number and {path_text(p.template)} a pod template"
            for p in decl.pod_sets) + f" (at most {MAX_POD_SETS} pod sets, named apart)"
        self.ready_from_pods = decl.ready is None

    def _expanded(self, obj: Obj) -> list[tuple[str, Path, Path]] | None:
        """(name, count path, template path) of every pod set of `obj`: a
        `[*]` pod set gives one per element of its list, `<name>-<index>`
        (none while the list is absent); None when such a list is not one.
        Read no further than one past MAX_POD_SETS: a tenant's list of
        thousands is refused by that count, not expanded whole."""
        found: list[tuple[str, Path, Path]] = []
        for declared in self.decl.pod_sets:
            over = list_part(declared.count)
            if not over:
                found.append((declared.name, declared.count, declared.template))
                continue
            items = dig(obj, over)
            if items is not None and not isinstance(items, list):
                return None
            for index in range(min(len(items or ()), MAX_POD_SETS + 1 - len(found))):
                def at(path: Path, index: int = index) -> Path:
                    return tuple(index if step == EVERY else step for step in path)
                found.append((f"{declared.name}-{index}", at(declared.count),
                              at(declared.template)))
        return found

    def templates(self, obj: Obj) -> tuple[Path, ...]:
        return tuple(template for _, _, template in self._expanded(obj) or ())

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        expanded = self._expanded(obj)
        if expanded is None or len(expanded) > MAX_POD_SETS \
                or len({name for name, _, _ in expanded}) < len(expanded):
            return None
        pod_sets = []
        for name, count_path, template in expanded:
            # No default for a missing count: the CRD's schema defaults it, or
            # the object is refused (its pods could not be counted).
            count = dig(obj, count_path)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                return None
            requests = template_requests(obj, template)
            if requests is None:
                return None
            if count:
                pod_sets.append(PodSetSpec(name, count, requests, template))
        return (UnitSpec("", tuple(pod_sets)),) if pod_sets else ()

    def outcome(self, obj: Obj) -> Outcome | None:
        found = condition_true(obj, (*self.decl.failed, *self.decl.finished))
        if found is None:
            return None
        return "Failed" if found in self.decl.failed else "Complete"

    def ready(self, obj: Obj) -> int:
        return 0 if self.decl.ready is None else whole(dig(obj, self.decl.ready))


def build(declarations: Collection[Declaration]) -> tuple[DeclaredIntegration, ...]:
    return tuple(DeclaredIntegration(decl) for decl in declarations)
