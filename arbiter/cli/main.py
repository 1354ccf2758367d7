"""The `arbiter` command line: one sub-command per module, wired here.

Each sub-command module exposes `add_parser(subparsers)`, which registers its
parser and sets `handler` (a callable taking the parsed namespace and
returning an exit code). Modules are imported lazily by name so that a
light command (`arbiter fairshare`) does not pay for aiohttp or the
Kubernetes client.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import cast

# (sub-command, module providing add_parser): the one list to edit when a
# command is added.
COMMAND_MODULES: tuple[tuple[str, str], ...] = (
    ("fairshare", "arbiter.cli.fairshare"),
    ("sandbox", "arbiter.sandbox.cli"),
    ("flow", "arbiter.jobflow.cli"),
    ("serve", "arbiter.cli.serve"),
    ("queues", "arbiter.cli.queues"),
    ("approve", "arbiter.cli.approve"),
    ("reject", "arbiter.cli.approve"),
    ("demo", "arbiter.cli.demo"),
    ("integrations", "arbiter.cli.integrations"),
)


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arbiter",
        description="kube-arbiter: multi-tenant job queueing for Kubernetes.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, module_name in COMMAND_MODULES:
        if name in subparsers.choices:
            continue  # a module registering several commands did it already
        # Only import the module the user asked for; list the rest by name.
        if wanted is None or wanted == name or wanted not in dict(COMMAND_MODULES):
            module = importlib.import_module(module_name)
            module.add_parser(subparsers)
        else:
            subparsers.add_parser(name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    handler = cast(Callable[[argparse.Namespace], int], args.handler)
    return handler(args)
