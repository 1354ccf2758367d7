"""A declaration checked against its CRD (`declared`): the CRD is the kind
declared (group, kind, plural, namespaced, the version served) and every
path resolves in that version's openAPIV3Schema to what arbiter reads there:

- `suspendPath`: `type: boolean`;
- a pod set's `countPath` (and `readyPath`): `type: integer`;
- a pod set's `templatePath`: an object whose `spec.containers` is an
  array (a PodTemplateSpec written out), or an object the schema does not
  describe (`x-kubernetes-preserve-unknown-fields` or
  `x-kubernetes-embedded-resource` without properties): accepted with a
  note, since the webhook then checks each object for a pod spec there.

A step through a described object must name one of its properties (or its
`additionalProperties`); a step into an object the schema leaves open
(preserve-unknown-fields) is accepted with a note: nothing there can be
checked. Pure: the caller reads the CRD.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arbiter.integrations.base import Path, dig
from arbiter.integrations.declared import EVERY, Declaration, DeclarationError, path_text

Schema = Mapping[str, Any]
_OPEN = "x-kubernetes-preserve-unknown-fields"
_EMBEDDED = "x-kubernetes-embedded-resource"


class Open:
    """A path that leads into a part of the schema that is not described."""

    def __init__(self, at: str) -> None:
        self.at = at


def resolve(schema: Schema, path: Path) -> Schema | Open | str:
    """The schema of the field at `path`; Open when it lies in an undescribed
    object; a reason (str) when the schema has no such field."""
    node = schema
    for depth, step in enumerate(path):
        if step == EVERY:
            items = node.get("items")
            if node.get("type") == "array" and isinstance(items, Mapping):
                node = items
                continue
            if node.get(_OPEN) is True:
                return Open(path_text(path[:depth]))
            return f"{path_text(path[:depth])} is {_type(node)}, not a list"
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        if isinstance(properties, Mapping) and isinstance(properties.get(step), Mapping):
            node = properties[step]
        elif isinstance(extra, Mapping):
            node = extra
        elif node.get(_OPEN) is True:
            return Open(path_text(path[:depth]) or "the object")
        else:
            where = path_text(path[:depth]) or "the object's root"
            if node.get("type") not in (None, "object"):
                return f"{where} is of type {node.get('type')}, not an object"
            return f"{where} has no field {step!r}"
    return node


def _type(node: Schema) -> str:
    return str(node.get("type") or ("int-or-string" if node.get("x-kubernetes-int-or-string")
                                    else "untyped"))


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def version_schema(decl: Declaration, crd: Any) -> Schema:
    """The openAPIV3Schema of the declared version; refuses a CRD of
    another kind or one that does not serve that version."""
    where = f"{decl.field}.kind"
    if not isinstance(crd, Mapping) or crd.get("kind") != "CustomResourceDefinition":
        raise DeclarationError(where, "the CRD given is not a CustomResourceDefinition")
    spec = _map(crd.get("spec"))
    names = _map(spec.get("names"))
    got = (spec.get("group"), names.get("kind"), names.get("plural"))
    if got != (decl.group, decl.kind, decl.resource):
        raise DeclarationError(where, f"the CRD defines {got[1]} ({got[2]}.{got[0]}), not "
                               f"{decl.kind} ({decl.resource}.{decl.group})")
    if spec.get("scope") != "Namespaced":
        raise DeclarationError(where, f"{decl.kind} is cluster-scoped; arbiter queues "
                               "namespaced workloads only")
    found = spec.get("versions")
    versions: list[Any] = found if isinstance(found, list) else []
    version = next((v for v in versions if isinstance(v, Mapping)
                    and v.get("name") == decl.version), None)
    if version is None or version.get("served") is not True:
        served = [v.get("name") for v in versions if isinstance(v, Mapping) and v.get("served")]
        raise DeclarationError(f"{decl.field}.version", f"the CRD does not serve "
                               f"{decl.version} (served: {', '.join(map(str, served)) or 'none'})")
    schema = dig(version, ("schema", "openAPIV3Schema"))
    if not isinstance(schema, Mapping):
        raise DeclarationError(f"{decl.field}.version",
                               f"the CRD's {decl.version} has no openAPIV3Schema")
    return schema


def _expect(schema: Schema, path: Path, field: str, wanted: str, notes: list[str]) -> Schema | None:
    found = resolve(schema, path)
    if isinstance(found, str):
        raise DeclarationError(field, f"{path_text(path)} does not resolve: {found}")
    if isinstance(found, Open):
        notes.append(f"{field}: {path_text(path)} is inside {found.at}, which the schema "
                     "leaves open (x-kubernetes-preserve-unknown-fields): not checked")
        return None
    if wanted and found.get("type") != wanted:
        raise DeclarationError(field, f"{path_text(path)} is {_type(found)} in the CRD's "
                               f"schema, not {wanted}")
    return found


def _template(schema: Schema, path: Path, field: str, notes: list[str]) -> None:
    found = _expect(schema, path, field, "", notes)
    if found is None:
        return
    if found.get("type") not in (None, "object"):
        raise DeclarationError(field, f"{path_text(path)} is {_type(found)} in the CRD's "
                               "schema, not a pod template (object)")
    containers = resolve(found, ("spec", "containers"))
    if isinstance(containers, Mapping) and containers.get("type") == "array":
        return
    described = isinstance(found.get("properties"), Mapping)
    if not described and (found.get(_OPEN) is True or found.get(_EMBEDDED) is True):
        notes.append(f"{field}: {path_text(path)} is an object the schema does not describe: "
                     "each object is checked for a pod spec there when it is created")
        return
    if isinstance(containers, Open):
        notes.append(f"{field}: {path_text(path)}.spec is left open by the schema: "
                     "not checked")
        return
    reason = containers if isinstance(containers, str) else "spec.containers is not an array"
    raise DeclarationError(field, f"{path_text(path)} is not a pod template in the CRD's "
                           f"schema ({reason})")


def check(decl: Declaration, crd: Any) -> list[str]:
    """Check `decl` against `crd`; raises DeclarationError naming the field,
    else returns notes on what could not be checked."""
    schema = version_schema(decl, crd)
    notes: list[str] = []
    _expect(schema, decl.suspend, f"{decl.field}.suspendPath", "boolean", notes)
    for index, pod_set in enumerate(decl.pod_sets):
        where = f"{decl.field}.podSets[{index}]"
        _expect(schema, pod_set.count, f"{where}.countPath", "integer", notes)
        _template(schema, pod_set.template, f"{where}.templatePath", notes)
    if decl.ready is not None:
        _expect(schema, decl.ready, f"{decl.field}.readyPath", "integer", notes)
    return notes
