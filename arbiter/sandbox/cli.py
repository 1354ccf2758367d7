"""`arbiter sandbox up|down|status|build`: the local control plane from the command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from arbiter.sandbox import build, controllers, integrations, kueue
from arbiter.sandbox.cluster import DEFAULT_DIR, Sandbox
from arbiter.sandbox.config import NodeShape
from arbiter.sandbox.probe import SandboxError, all_healthy
from arbiter.sandbox.process import KubectlError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sandbox",
        help="run a real local Kubernetes control plane with fake nodes",
        description="A local control plane (etcd, kube-apiserver, kube-controller-manager, "
        "kube-scheduler, kwok fake nodes) with arbiter wired in, as background processes.",
    )
    commands = parser.add_subparsers(dest="sandbox_command", metavar="SUBCOMMAND")
    commands.required = True

    up = commands.add_parser("up", help="build if needed, start everything, wait until healthy")
    _add_dir(up)
    up.add_argument("--nodes", type=int, default=4, help="fake nodes (default 4)")
    up.add_argument("--node-cpu", default="8", help="allocatable CPU per node (default 8)")
    up.add_argument(
        "--node-memory", default="32Gi", help="allocatable memory per node (default 32Gi)"
    )
    up.add_argument("--node-gpu", type=int, default=0, help="nvidia.com/gpu per node (default 0)")
    up.add_argument(
        "--no-arbiter", action="store_true", help="do not start arbiter or wire the extender"
    )
    up.add_argument(
        "--integrations", default="all", metavar="LIST",
        help="integration controllers to run: comma-separated from "
        f"{', '.join(integrations.INTEGRATIONS)}, or all (default) or none",
    )
    up.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for health (default 180)"
    )
    up.set_defaults(handler=_up)

    down = commands.add_parser(
        "down", help="stop every process the sandbox started, remove its state"
    )
    _add_dir(down)
    down.set_defaults(handler=_down)

    status = commands.add_parser(
        "status", help="what runs, where it logs; exit 0 only when all healthy"
    )
    _add_dir(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=_status)

    build_cmd = commands.add_parser(
        "build", help="build (or find cached) the control plane and the integration controllers")
    build_cmd.add_argument("--force", action="store_true", help="rebuild even when cached")
    build_cmd.add_argument(
        "--with", dest="with_extra", action="append", default=[], choices=["kueue"],
        help="also build Kueue's manager (for bench/compare_kueue.py; minutes when cold)",
    )
    build_cmd.set_defaults(handler=_build)


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"sandbox directory (default {DEFAULT_DIR})"
    )


def _up(args: argparse.Namespace) -> int:
    if args.nodes < 0 or args.node_gpu < 0:
        print("arbiter sandbox up: --nodes and --node-gpu must be >= 0", file=sys.stderr)
        return 2
    try:
        wanted = integrations.parse(args.integrations)
    except ValueError as error:
        print(f"arbiter sandbox up: --integrations: {error}", file=sys.stderr)
        return 2
    sandbox = Sandbox(args.dir)
    shape = NodeShape(
        count=args.nodes, cpu=args.node_cpu, memory=args.node_memory, gpu=args.node_gpu
    )
    started = time.monotonic()
    try:
        started_now = sandbox.up(shape, arbiter=not args.no_arbiter, integrations=wanted,
                                 timeout=args.timeout)
    except (SandboxError, KubectlError, build.BuildError) as error:
        print(f"arbiter sandbox up: {error}", file=sys.stderr)
        print(sandbox.log_tails(30), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    elapsed = time.monotonic() - started
    kubectl = sandbox.kubectl_path
    arbiter = (
        f", arbiter at https://127.0.0.1:{sandbox.arbiter_port}" if sandbox.arbiter_port else ""
    )
    how = f"up in {elapsed:.1f}s" if started_now else "already running"
    print(f"sandbox {how}: {sandbox.ready_nodes()} fake nodes Ready{arbiter}")
    print(f"  apiserver:  {sandbox.apiserver_url}")
    if sandbox.arbiter_port:
        print(f"  web view:   {sandbox.arbiter_metrics_url()}/view/   (this host only)")
    running = [name for name in integrations.INTEGRATIONS if name in sandbox.processes()]
    print(f"  integrations: {', '.join(running) or 'none'}")
    print(f"  kubeconfig: {sandbox.kubeconfig}")
    print(f"  kubectl:    {kubectl} get nodes        (uses the sandbox kubeconfig)")
    print(f"  or:         export KUBECONFIG={sandbox.kubeconfig}")
    print(f"  logs:       {sandbox.logs_dir}/<component>.log")
    print(f"  status:     arbiter sandbox status --dir {args.dir}")
    print(f"  stop:       arbiter sandbox down --dir {args.dir}")
    return 0


def _down(args: argparse.Namespace) -> int:
    sandbox = Sandbox(args.dir)
    try:
        stopped = sandbox.down()
    except SandboxError as error:
        print(f"arbiter sandbox down: {error}", file=sys.stderr)
        return 1
    if stopped:
        print(f"stopped {', '.join(stopped)}; logs kept in {sandbox.logs_dir}")
    else:
        print(f"nothing was running in {sandbox.dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    sandbox = Sandbox(args.dir)
    components = sandbox.status()
    if not components:
        print(f"no sandbox in {sandbox.dir}")
        return 1
    expected = sandbox.node_shape.count
    ready = sandbox.ready_nodes()
    healthy = all_healthy(components) and ready >= expected
    if args.json:
        document = {
            "dir": str(sandbox.dir),
            "healthy": healthy,
            "nodes": {"ready": ready, "expected": expected},
            "kubeconfig": str(sandbox.kubeconfig),
            "components": [
                {
                    "name": c.name,
                    "pid": c.pid,
                    "running": c.running,
                    "healthy": c.healthy,
                    "required": c.required,
                    "detail": c.detail,
                    "ports": c.ports,
                    "log": c.log,
                }
                for c in components
            ],
        }
        print(json.dumps(document, indent=2))
        return 0 if healthy else 1
    print(f"sandbox {sandbox.dir}: {'healthy' if healthy else 'UNHEALTHY'}")
    for c in components:
        state = "healthy" if c.healthy else "UNHEALTHY" if c.required else "stopped"
        ports = ",".join(f"{k}={v}" for k, v in c.ports.items())
        print(f"  {c.name:<24} pid {c.pid:<8} {state:<9} {ports:<22} {c.detail}")
        print(f"  {'':<24} log {c.log}")
    print(f"  nodes Ready: {ready}/{expected}")
    print(f"  kubeconfig: {sandbox.kubeconfig}")
    return 0 if healthy else 1


def _build(args: argparse.Namespace) -> int:
    try:
        toolchain = build.ensure_built(force=args.force)
        extra = [controllers.ensure_controller_built(integration.controller, force=args.force).root
                 for integration in integrations.INTEGRATIONS.values()]
        if args.with_extra:
            extra.append(kueue.ensure_kueue_built(force=args.force).root)
    except build.BuildError as error:
        print(f"arbiter sandbox build: {error}", file=sys.stderr)
        return 1
    for root in (toolchain.root, *extra):
        print(root)
    return 0
