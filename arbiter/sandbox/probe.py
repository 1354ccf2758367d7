"""Health of the sandbox's processes over loopback: TLS contexts, a small
HTTP GET, and what `arbiter sandbox status` reports per process."""

from __future__ import annotations

import http.client
import os
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbiter.sandbox import process
from arbiter.sandbox.process import ProcessRecord


class SandboxError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str
    pid: int
    running: bool
    healthy: bool
    detail: str
    log: str
    ports: dict[str, int]
    # False for a further arbiter replica stopped on purpose: it no longer
    # counts for the sandbox's health. The primary always counts (the
    # webhooks and the scheduler's extender point at it), and so does any
    # process that died without being asked to.
    required: bool = True


def all_healthy(components: Sequence[ComponentStatus]) -> bool:
    """The processes that count are all healthy (and at least one counts)."""
    counted = [c for c in components if c.required]
    return bool(counted) and all(c.healthy for c in counted)


def verified_context(
    ca_file: Path, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_file))
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def unverified_context() -> ssl.SSLContext:
    # kube-controller-manager and kube-scheduler serve /healthz with a
    # self-signed certificate they make at start; on loopback, for a health
    # probe, there is nothing to verify it against.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def http_get(
    url: str, context: ssl.SSLContext | None = None, timeout: float = 5.0
) -> tuple[int, bytes]:
    """GET a loopback URL: (status, body); status 0 when nothing answered."""
    scheme, rest = url.split("://", 1)
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    connection: http.client.HTTPConnection
    if scheme == "https":
        connection = http.client.HTTPSConnection(host, int(port), timeout=timeout, context=context)
    else:
        connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("GET", "/" + path)
        response = connection.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        connection.close()


def probe_process(record: ProcessRecord,
                  context: Callable[[], ssl.SSLContext | None]) -> tuple[bool, str]:
    """(healthy, detail) for one process: running and its health URL answers 200."""
    if not process.is_running(record):
        code = process.exit_code(record.pid)
        return False, "not running" if code is None else f"exited with status {code}"
    if record.health_url is None:
        return True, "running"
    try:
        tls = context()
    except (OSError, ssl.SSLError) as error:
        return False, f"no TLS context: {error}"
    status, body = http_get(record.health_url, tls, timeout=3.0)
    if status == 200:
        return True, f"{record.health_url} ok"
    if status == 0:
        return False, f"{record.health_url} does not answer"
    return False, f"{record.health_url} answered {status}: {body[:200].decode(errors='replace')}"


def established(crd: Mapping[str, Any]) -> bool:
    """Whether a CustomResourceDefinition (as the apiserver returns it) is served."""
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def ready_count(nodes: Mapping[str, Any]) -> int:
    """How many Nodes of a NodeList have their Ready condition True."""
    return sum(1 for node in nodes.get("items", [])
               if any(c.get("type") == "Ready" and c.get("status") == "True"
                      for c in node.get("status", {}).get("conditions", [])))


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a log file (read from its end)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 200 * lines))
            text = handle.read().decode(errors="replace")
    except OSError as error:
        return f"(no log: {error})"
    return "\n".join(text.splitlines()[-lines:])


def log_tails(processes: dict[str, ProcessRecord], logs_dir: Path, lines: int) -> str:
    """The last `lines` lines of every component's log (the recorded
    processes', else every log in `logs_dir`), for failure reports."""
    logs = {name: Path(record.log) for name, record in processes.items()}
    if not logs and logs_dir.is_dir():
        logs = {path.stem: path for path in sorted(logs_dir.glob("*.log"))}
    return "\n".join(f"===== {name} ({path}) =====\n{tail(path, lines)}"
                     for name, path in logs.items())


def wait_until(what: str, check: Callable[[], bool], deadline: float,
               processes: Callable[[], Mapping[str, ProcessRecord]],
               watch: Sequence[str] | None = None) -> None:
    """Poll `check` until true; fail fast when a watched process (default:
    every one not stopped on purpose) has died, with the end of its log; on
    timeout, show the end of the watched processes' logs."""
    while True:
        if check():
            return
        for name, record in processes().items():
            if record.stopped and watch is None:
                continue
            if (watch is None or name in watch) and not process.is_running(record):
                raise SandboxError(f"{record.name} exited while waiting for {what}; "
                                   f"last lines of {record.log}:\n{tail(Path(record.log), 40)}")
        if time.monotonic() > deadline:
            logs = [f"last lines of {record.log}:\n{tail(Path(record.log), 40)}"
                    for name, record in processes().items() if name in (watch or ())]
            raise SandboxError("\n".join([f"timed out waiting for {what}", *logs]))
        time.sleep(0.2)
