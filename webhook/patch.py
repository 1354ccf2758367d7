"""JSON Patch (RFC 6902) building for the few edits arbiter makes.

Paths are JSON Pointers (RFC 6901): "~" and "/" inside a key are escaped as
"~0" and "~1", so the label `arbiter.dev/queue` is the path segment
`arbiter.dev~1queue`. An absent parent (no labels, no schedulingGates) is
added whole, because "add" into a missing member fails on the apiserver.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.review import PatchOp


def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str) -> str:
    return "".join("/" + escape(token) for token in tokens)


def set_label(
    ops: list[PatchOp],
    base: tuple[str, ...],
    meta: Mapping[str, Any] | None,
    labels: Mapping[str, str] | None,
    key: str,
    value: str,
) -> None:
    """Set metadata label `key` at `base` (the path of the object holding
    `metadata`), adding `metadata` or `labels` when missing."""
    if labels is not None and labels.get(key) == value:
        return
    if meta is None:
        ops.append({"op": "add", "path": pointer(*base, "metadata"),
                    "value": {"labels": {key: value}}})
    elif labels is None:
        ops.append({"op": "add", "path": pointer(*base, "metadata", "labels"),
                    "value": {key: value}})
    else:
        # "add" on an existing object member replaces it (RFC 6902 §4.1).
        ops.append({"op": "add", "path": pointer(*base, "metadata", "labels", key),
                    "value": value})


def apply_patch(document: Any, ops: list[PatchOp]) -> Any:
    """Apply `ops` to a copy of `document` (add/remove/replace only).

    The apiserver applies our patches; this exists so tests and the fuzz
    harness can check that every patch arbiter emits applies cleanly.
    """
    import copy

    result = copy.deepcopy(document)
    for op in ops:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        if not tokens:
            raise ValueError("patching the document root is not supported")
        parent = result
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif op["op"] == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            elif isinstance(parent, dict):
                if op["op"] == "replace" and last not in parent:
                    raise KeyError(op["path"])
                parent[last] = op["value"]
            else:
                raise TypeError(f"{op['path']}: parent is not a container")
        elif op["op"] == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return result
