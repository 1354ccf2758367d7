"""`arbiter integrations`: declared integrations, offline, for admins.

    arbiter integrations check --file F [--crd crd.yaml ...]
        parse F as `serve --integration-file` does and check each declared
        kind against its CRD among the files given (a kind without one is
        parsed only, and said so); exit 1 with one line naming the field
    arbiter integrations manifest --file F
        the webhooks and ClusterRole rules to add for the declared kinds
        (manifests/webhooks.yaml, manifests/rbac.yaml), as YAML
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from arbiter.integrations.declared import DeclarationError, build
from arbiter.integrations.declared_schema import check
from arbiter.server import declared


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("integrations", help="check declared integrations")
    commands = parser.add_subparsers(dest="integrations_command", metavar="COMMAND")
    commands.required = True
    checking = commands.add_parser("check", help="check a declaration file against CRDs")
    checking.add_argument("--file", required=True, type=Path, help="the declaration file")
    checking.add_argument("--crd", action="append", default=[], type=Path, metavar="FILE",
                          help="a YAML file with CRDs (repeatable; several documents each)")
    checking.set_defaults(handler=run_check)
    manifest = commands.add_parser("manifest", help="webhook and RBAC rules for the kinds")
    manifest.add_argument("--file", required=True, type=Path, help="the declaration file")
    manifest.set_defaults(handler=run_manifest)


def _crds(paths: Iterable[Path]) -> dict[str, Any]:
    """CRDs by name (`widgets.example.com`) from every document of the files."""
    found: dict[str, Any] = {}
    for path in paths:
        try:
            documents = list(yaml.safe_load_all(path.read_text()))
        except (OSError, yaml.YAMLError) as error:
            raise DeclarationError(str(path), " ".join(str(error).split())) from None
        for doc in documents:
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                found[str((doc.get("metadata") or {}).get("name", ""))] = doc
    return found


def run_check(args: argparse.Namespace) -> int:
    try:
        integrations = build(declared.load(args.file))
        crds = _crds(args.crd)
        for integration in integrations:
            crd = crds.get(integration.name)
            where = f"{integration.kind} ({integration.name}/{integration.version})"
            if crd is None:
                print(f"{where}: parsed; no CRD given, not checked against one")
                continue
            notes = check(integration.decl, crd)
            print(f"{where}: ok")
            for note in notes:
                print(f"  note: {note}")
    except DeclarationError as error:
        print(f"{args.file}: {error}", file=sys.stderr)
        return 1
    return 0


def run_manifest(args: argparse.Namespace) -> int:
    try:
        integrations = build(declared.load(args.file))
    except DeclarationError as error:
        print(f"{args.file}: {error}", file=sys.stderr)
        return 1
    declared.register(integrations)
    try:
        print(declared.dumps(declared.manifest(integrations)), end="")
    finally:
        declared.register(integrations, on=False)
    return 0
