"""Faults a chaos run injects into a running sandbox's control plane: a
component restarted (stopped, then started again with the very command
line, port and log it had), or paused and resumed (SIGSTOP/SIGCONT: a
stalled etcd). By recorded pid only, as everything in the sandbox.

Kept out of `cluster.Sandbox` on purpose: nothing but fault injection wants
these, and the state file must follow a restarted process so that
`Sandbox.down()` stops the new one.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from pathlib import Path

from arbiter.sandbox import process
from arbiter.sandbox.cluster import Sandbox
from arbiter.sandbox.probe import SandboxError, http_get, wait_until


def restart_component(sandbox: Sandbox, name: str, *, down_for: float = 0.0,
                      extra_args: Sequence[str] = (), timeout: float = 240.0) -> int:
    """Stop `name` (SIGTERM, then SIGKILL), wait `down_for` seconds, start it
    again as it was (plus `extra_args`, kept for later restarts) and wait
    until it is healthy; returns the new pid."""
    old = sandbox.processes()[name]
    process.stop(old)
    time.sleep(down_for)
    args = [*old.args, *(arg for arg in extra_args if arg not in old.args)]
    record = process.spawn(name, args, Path(old.log), cwd=sandbox.dir,
                           ports=old.ports, health_url=old.health_url)
    sandbox._record(record)
    if name == "kube-apiserver":
        # Serving is what its clients need. Its /readyz and /livez can stay
        # failed for minutes after a restart on a loaded machine (its
        # rbac/bootstrap-roles post-start hook), while it serves every request.
        path = sandbox.apiserver_url + "/api/v1/namespaces/default"
        wait_until(f"{name} serving", lambda: http_get(path, sandbox._admin_context())[0] == 200,
                   time.monotonic() + timeout, sandbox.processes, [name])
    else:
        sandbox._wait_healthy(name, time.monotonic() + timeout, watch=[name])
    return record.pid


def pause(sandbox: Sandbox, name: str) -> None:
    """SIGSTOP `name` (its whole process group); `resume` undoes it."""
    if not process.signal_process(sandbox.processes()[name], signal.SIGSTOP):
        raise SandboxError(f"{name} does not run: cannot pause it")


def resume(sandbox: Sandbox, name: str) -> None:
    process.signal_process(sandbox.processes()[name], signal.SIGCONT)
