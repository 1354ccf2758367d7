"""`arbiter flow status|from-job|to-job`: JobFlows from the command line.

- `status NAME` prints the DAG as a text tree with each step's phase;
- `from-job JOB` prints a JobTemplate (YAML) made from a live Job;
- `to-job TEMPLATE` prints the Job (YAML) a JobTemplate stands for.

The rendering and conversion are pure functions (`render_flow`,
`patch.template_from_job`, `patch.job_from_template`); the handlers only
fetch the object.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from arbiter.cache.jobflow_records import FlowSpecError, parse_flow_spec
from arbiter.core.api import API_PATH
from arbiter.jobflow.patch import job_from_template, template_from_job

Obj = dict[str, Any]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "flow", help="inspect JobFlows; convert between Jobs and JobTemplates",
        description="JobFlow tools: a flow's DAG with step phases, and Job <-> JobTemplate.")
    commands = parser.add_subparsers(dest="flow_command", metavar="SUBCOMMAND")
    commands.required = True

    status = commands.add_parser("status", help="print the flow's DAG with each step's phase")
    status.add_argument("name", metavar="NAME", help="the JobFlow")
    _common(status)
    status.set_defaults(handler=_status)

    from_job = commands.add_parser("from-job", help="print a JobTemplate made from a live Job")
    from_job.add_argument("job", metavar="JOB", help="the Job to copy")
    from_job.add_argument("--name", help="the JobTemplate's name (default: the Job's)")
    _common(from_job)
    from_job.set_defaults(handler=_from_job)

    to_job = commands.add_parser("to-job", help="print the Job a JobTemplate stands for")
    to_job.add_argument("template", metavar="TEMPLATE", help="the JobTemplate")
    to_job.add_argument("--name", help="the Job's name (default: the template's)")
    _common(to_job)
    to_job.set_defaults(handler=_to_job)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", default=None,
                        help="namespace (default: the kubeconfig context's, else default)")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")


# -- pure rendering ---------------------------------------------------------
def _step_status(flow: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    status = flow.get("status") or {}
    entries: dict[str, Mapping[str, Any]] = {}
    for entry in status.get("steps") or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            entries[entry["name"]] = entry
    return entries


def _label(name: str, entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return f"{name}  Waiting"
    text = f"{name}  {entry.get('phase', 'Waiting')}"
    details = []
    if entry.get("jobName") and entry.get("history"):
        details.append(f"job {entry['jobName']}")
    restarts = entry.get("restartCount") or 0
    if restarts:
        details.append(f"{restarts} restart{'s' if restarts != 1 else ''}")
    if entry.get("runningDuration"):
        details.append(f"ran {entry['runningDuration']}")
    if details:
        text += f"  ({', '.join(details)})"
    if entry.get("message") and entry.get("phase") in ("Waiting", "Failed", "Skipped"):
        text += f"  - {entry['message']}"
    return text


def render_flow(flow: Mapping[str, Any]) -> str:
    """The flow as a text tree: roots at the left, each step under the
    steps it depends on; a step with several targets is drawn in full under
    the first and referred to under the others."""
    meta = flow.get("metadata") or {}
    status = flow.get("status") or {}
    state = status.get("state") or {}
    name = meta.get("name", "?")
    header = f"JobFlow {meta.get('namespace', '')}/{name}: {state.get('phase', 'Pending')}"
    if status.get("progress"):
        header += f" ({status['progress']} steps succeeded)"
    lines = [header]
    if state.get("message"):
        lines.append(f"  {state['message']}")
    try:
        steps = parse_flow_spec(flow.get("spec")).steps
    except FlowSpecError as error:
        return "\n".join([*lines, f"  invalid spec: {error}"]) + "\n"
    entries = _step_status(flow)
    names = [s.name for s in steps]
    children: dict[str, list[str]] = {n: [] for n in names}
    for s in steps:
        for target in dict.fromkeys(s.targets):
            if target in children and target != s.name:
                children[target].append(s.name)
    drawn: set[str] = set()

    def draw(node: str, prefix: str, last: bool, root: bool, path: tuple[str, ...]) -> None:
        connector = "" if root else ("└── " if last else "├── ")
        if node in drawn or node in path:
            lines.append(f"{prefix}{connector}{node}  (see above)")
            return
        lines.append(f"{prefix}{connector}{_label(node, entries.get(node))}")
        drawn.add(node)
        below = prefix if root else prefix + ("    " if last else "│   ")
        kids = children[node]
        for index, kid in enumerate(kids):
            draw(kid, below, index == len(kids) - 1, False, (*path, node))

    roots = [s.name for s in steps if not [t for t in s.targets if t in children]]
    for root in roots:
        draw(root, "", True, True, ())
    for leftover in names:  # only in a flow with a cycle
        if leftover not in drawn:
            draw(leftover, "", True, True, ())
    return "\n".join(lines) + "\n"


def dump_yaml(obj: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(obj), sort_keys=False, default_flow_style=False)


# -- I/O --------------------------------------------------------------------
async def _get(kubeconfig: Path | None, namespace: str | None,
               path_of: Callable[[str], str]) -> Obj:
    from kubernetes_asyncio import config

    from arbiter.base.kubeapi import request_json

    client = await config.new_client_from_config(
        config_file=str(kubeconfig) if kubeconfig else None, persist_config=False)
    async with client:
        if namespace is None:
            namespace = _context_namespace(kubeconfig)
        return await request_json(client, "GET", path_of(namespace))


def _context_namespace(kubeconfig: Path | None) -> str:
    """The current context's namespace, else "default"."""
    import os

    path = kubeconfig or Path(os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
                              or Path.home() / ".kube" / "config")
    try:
        document = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return "default"
    current = document.get("current-context")
    for context in document.get("contexts") or []:
        if isinstance(context, dict) and context.get("name") == current:
            namespace = (context.get("context") or {}).get("namespace")
            if isinstance(namespace, str) and namespace:
                return namespace
    return "default"


def _fetch(args: argparse.Namespace, path_of: Callable[[str], str], what: str) -> Obj | None:
    from arbiter.base.kubeapi import ApiError

    try:
        return asyncio.run(_get(args.kubeconfig, args.namespace, path_of))
    except ApiError as error:
        print(f"arbiter flow: {what}: {error.message}", file=sys.stderr)
    except (OSError, ValueError) as error:
        print(f"arbiter flow: {what}: {error}", file=sys.stderr)
    return None


def _status(args: argparse.Namespace) -> int:
    flow = _fetch(args, lambda ns: f"{API_PATH}/namespaces/{ns}/jobflows/{args.name}",
                  f"JobFlow {args.name}")
    if flow is None:
        return 1
    sys.stdout.write(render_flow(flow))
    return 0


def _from_job(args: argparse.Namespace) -> int:
    job = _fetch(args, lambda ns: f"/apis/batch/v1/namespaces/{ns}/jobs/{args.job}",
                 f"Job {args.job}")
    if job is None:
        return 1
    sys.stdout.write(dump_yaml(template_from_job(job, args.name)))
    return 0


def _to_job(args: argparse.Namespace) -> int:
    template = _fetch(
        args, lambda ns: f"{API_PATH}/namespaces/{ns}/jobtemplates/{args.template}",
        f"JobTemplate {args.template}")
    if template is None:
        return 1
    sys.stdout.write(dump_yaml(job_from_template(template, args.name)))
    return 0
