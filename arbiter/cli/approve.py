"""`arbiter approve|reject NAMESPACE/UNIT [--message M]`: a person answers the
built-in admission check (controllerName `arbiter.dev/approval`, DESIGN §12).

The answer is one JSON Patch on the unit's status subresource, guarded by
`test` operations (the unit is still Reserved, each entry still names the
check it answers), so a unit that moved on meanwhile is never touched. RBAC
can grant exactly this: `patch` on `queueunits/status`, plus reading the
unit and the AdmissionChecks to find which of its checks are approvals
(`examples/approvers-rbac.yaml`), and which checks a person may answer:
verb `approve` on the AdmissionCheck by name, which the apiserver enforces
(manifests/approvals.yaml). Without `--check`, only the approval checks
the user may approve are answered (a SelfSubjectAccessReview each).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes_asyncio import config as kube_config

from arbiter.base.kubeapi import ApiError, ClusterApi, Invalid, KubeApi, NotFound, unit_path
from arbiter.core.api import (
    ADMISSION_CHECK,
    API_GROUP,
    APPROVAL_CONTROLLER,
    CheckState,
    format_rfc3339,
)

VERBS: Mapping[str, CheckState] = {"approve": "Ready", "reject": "Rejected"}
SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


class ApprovalError(Exception):
    """Why the answer was not given (one line, for the person)."""


def approval_ops(checks: Sequence[Mapping[str, Any]], names: Sequence[str],
                 state: CheckState, message: str, now: float) -> list[dict[str, Any]]:
    """The JSON Patch that sets `names` (entries of status.admissionChecks)
    to `state`, each guarded by a test of its name, all by the phase."""
    stamp = format_rfc3339(now)
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/status/phase", "value": "Reserved"}]
    for index, entry in enumerate(checks):
        if entry.get("name") not in names:
            continue
        at = f"/status/admissionChecks/{index}"
        ops += [
            {"op": "test", "path": f"{at}/name", "value": entry["name"]},
            {"op": "add", "path": f"{at}/state", "value": state},
            {"op": "add", "path": f"{at}/message", "value": message},
            {"op": "add", "path": f"{at}/lastTransitionTime", "value": stamp},
        ]
    return ops


async def _approval_checks(api: ClusterApi, entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names among `entries` whose AdmissionCheck is answered by a person."""
    names = []
    for entry in entries:
        name = str(entry.get("name") or "")
        try:
            check = await api.get(f"{ADMISSION_CHECK.path}/{name}")
        except NotFound:
            continue
        if (check.get("spec") or {}).get("controllerName") == APPROVAL_CONTROLLER \
                and await _may_approve(api, name):
            names.append(name)
    return names


async def _may_approve(api: ClusterApi, check: str) -> bool:
    """Whether RBAC lets the caller `approve` the AdmissionCheck `check`
    (True when the review says nothing: the apiserver's policy decides)."""
    review = await api.create(SSAR_PATH, {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"group": API_GROUP, "resource": "admissionchecks",
                                        "name": check, "verb": "approve"}}})
    status = review.get("status")
    return not isinstance(status, Mapping) or status.get("allowed") is not False


async def answer(api: ClusterApi, namespace: str, name: str, state: CheckState, *,
                 message: str = "", check: str | None = None,
                 now: float | None = None) -> list[str]:
    """Set the unit's approval checks (or just `check`) to `state`; returns
    the checks answered. ApprovalError when there is nothing to answer."""
    path = unit_path(namespace, name)
    try:
        unit = await api.get(path)
    except NotFound:
        raise ApprovalError(f"QueueUnit {namespace}/{name} not found") from None
    status = unit.get("status") or {}
    entries = [e for e in status.get("admissionChecks") or [] if isinstance(e, Mapping)]
    if status.get("phase") != "Reserved" or not entries:
        raise ApprovalError(f"QueueUnit {namespace}/{name} is not waiting on admission checks "
                            f"(phase {status.get('phase') or 'Enqueued'})")
    names = [check] if check is not None else await _approval_checks(api, entries)
    known = {e.get("name") for e in entries}
    if not names or not set(names) <= known:
        wanted = f"check {check}" if check is not None else \
            f"a check of controller {APPROVAL_CONTROLLER} you may approve"
        raise ApprovalError(f"QueueUnit {namespace}/{name} does not wait on {wanted} "
                            f"(its checks: {', '.join(sorted(map(str, known)))})")
    ops = approval_ops(entries, names, state, message, time.time() if now is None else now)
    try:
        await api.json_patch(unit_path(namespace, name, status=True), ops)
    except Invalid:
        raise ApprovalError(f"QueueUnit {namespace}/{name} changed meanwhile; "
                            "look again and retry") from None
    return names


# -- the command ------------------------------------------------------------------------
def _target(text: str) -> tuple[str, str]:
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAMESPACE/UNIT")
    return namespace, name


MAX_MESSAGE = 1024  # the QueueUnit CRD's maxLength of a check's message


def _message(text: str) -> str:
    if len(text) > MAX_MESSAGE:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_MESSAGE} characters (the unit's check message), got {len(text)}")
    return text


def add_parser(subparsers: Any) -> None:
    for verb, state in VERBS.items():
        if verb in subparsers.choices:
            continue  # registered as a bare name by `arbiter.cli.main` (another command ran)
        parser: argparse.ArgumentParser = subparsers.add_parser(
            verb,
            help=f"set a Reserved QueueUnit's approval check to {state}",
            description=f"Answer the admission check of controller {APPROVAL_CONTROLLER} "
                        f"on a Reserved QueueUnit: {state}. Needs patch on "
                        "queueunits/status (and get on queueunits and admissionchecks).",
        )
        parser.add_argument("unit", type=_target, metavar="NAMESPACE/UNIT")
        parser.add_argument("--message", "-m", default="", type=_message,
                            help="why (shown on the unit; at most 1,024 characters)")
        parser.add_argument("--check", default=None,
                            help="the AdmissionCheck to answer (default: every approval "
                                 "check the unit waits on)")
        parser.add_argument("--kubeconfig", type=Path, default=None,
                            help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
        parser.set_defaults(handler=run, state=state, verb=verb)


async def _run(args: argparse.Namespace) -> list[str]:
    client = await kube_config.new_client_from_config(
        config_file=str(args.kubeconfig) if args.kubeconfig else None, persist_config=False)
    async with client:
        namespace, name = args.unit
        return await answer(KubeApi(client), namespace, name, args.state,
                            message=args.message, check=args.check)


def run(args: argparse.Namespace) -> int:
    try:
        names = asyncio.run(_run(args))
    except (ApprovalError, ApiError) as error:
        print(f"arbiter {args.verb}: {error}", file=sys.stderr)
        return 1
    except (OSError, ValueError, kube_config.ConfigException) as error:
        print(f"arbiter {args.verb}: cannot reach the cluster: {error}", file=sys.stderr)
        return 1
    namespace, name = args.unit
    print(f"{namespace}/{name}: {', '.join(names)} {args.state}")
    return 0
