"""Starting, inspecting and stopping the sandbox's background processes.

Every process runs in its own session (so Ctrl-C in the terminal that ran
`arbiter sandbox up` does not reach it and `up` can exit), logs to a file,
and is later found again only by the pid *and* start time recorded when it
was started: a recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Popen handles of processes started by this Python process. Keeping them
# lets us reap our own children (a dead, unreaped child is a zombie whose pid
# still answers kill(pid, 0)) and keeps Popen's destructor quiet.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(slots=True)
class ProcessRecord:
    """What state.json remembers about one started process."""

    name: str
    pid: int
    start_ticks: int
    args: list[str]
    log: str
    ports: dict[str, int] = field(default_factory=dict)
    health_url: str | None = None
    # Stopped on purpose (`Sandbox.stop_arbiter`/`kill_arbiter`), not crashed;
    # a new start of the same name records a fresh, not-stopped record.
    stopped: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            start_ticks=int(data["start_ticks"]),
            args=[str(a) for a in data["args"]],
            log=str(data["log"]),
            ports={str(k): int(v) for k, v in dict(data.get("ports", {})).items()},
            health_url=data.get("health_url"),
            stopped=bool(data.get("stopped", False)),
        )


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call; unlike CalledProcessError, str() includes stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr or ''}".rstrip()


# Listening ports come from below the kernel's ephemeral range: a port from
# inside it (what binding port 0 gives) can be taken by any outgoing
# connection between choosing it and the server binding it ("address already
# in use" at start-up, seen with the Trainer controller).
_LISTEN_PORTS = (20000, 32000)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def listen_port_range() -> tuple[int, int]:
    """Where free_ports picks: [20000, 32000) clipped below the ephemeral range."""
    low, high = _LISTEN_PORTS
    ephemeral_low, ephemeral_high = _ephemeral_range()
    if ephemeral_low < high and ephemeral_high >= low:  # an unusual, overlapping range
        high = max(low + 1000, min(high, ephemeral_low))
    return low, high


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (see
    free_ports; a small race with other programs remains, so callers check
    that the process came up healthy)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports outside the ephemeral range (sockets held
    open together so none repeats). Chosen at random, so that parallel test
    workers rarely try the same one."""
    low, high = listen_port_range()
    chooser = random.Random(os.urandom(8))
    sockets: list[socket.socket] = []
    try:
        for _ in range(50 * count):
            if len(sockets) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", chooser.randrange(low, high)))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        while len(sockets) < count:  # that range is crowded: let the kernel pick
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces.
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot (stat field 22), or None."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None:
        child.poll()


def is_running(record: ProcessRecord) -> bool:
    """True while the recorded process (same pid, same start time) is alive and not a zombie."""
    _reap(record.pid)
    fields = _stat_fields(record.pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return int(fields[19]) == record.start_ticks


def remains(record: ProcessRecord) -> bool:
    """True while the recorded process (same pid, same start time) exists at all,
    a zombie included; a recycled pid is another process."""
    _reap(record.pid)
    fields = _stat_fields(record.pid)
    return fields is not None and int(fields[19]) == record.start_ticks


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def spawn(
    name: str,
    args: list[str],
    log: Path,
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    ports: dict[str, int] | None = None,
    health_url: str | None = None,
) -> ProcessRecord:
    """Start `args` detached (own session, stdin closed), appending output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"==> {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(args)}\n".encode())
        out.flush()
        child = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN[child.pid] = child
    ticks = start_ticks(child.pid)
    if ticks is None:  # exited already: still record it, so its log is shown
        ticks = -1
    return ProcessRecord(
        name=name,
        pid=child.pid,
        start_ticks=ticks,
        args=args,
        log=str(log),
        ports=dict(ports or {}),
        health_url=health_url,
    )


def wait_exit(record: ProcessRecord, timeout: float) -> bool:
    """Wait until the process is gone; True if it went within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while is_running(record):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    # A multi-threaded process (every Go binary) shows as a zombie as soon as
    # its main thread exits, but cannot be reaped until its other threads
    # have: wait for that too (briefly), so that a stopped process is gone.
    settled = time.monotonic() + 2.0
    while remains(record) and time.monotonic() < settled:
        time.sleep(0.02)
    return True


def signal_process(record: ProcessRecord, sig: int) -> bool:
    """Send `sig` to the recorded process if it is still that process; True if sent.

    Each process was started as a session (and so process-group) leader, so
    the signal goes to its group: helpers it forked go down with it.
    """
    if not is_running(record):
        return False
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(record.pid) == record.pid:
            os.killpg(record.pid, sig)
        else:
            os.kill(record.pid, sig)
        return True
    return False


def stop(record: ProcessRecord, timeout: float = 10.0) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL; by pid only, never by name."""
    if signal_process(record, signal.SIGTERM) and not wait_exit(record, timeout):
        signal_process(record, signal.SIGKILL)
        wait_exit(record, 5.0)


def exit_code(pid: int) -> int | None:
    """The exit status of a child this process started, once it has ended."""
    child = _CHILDREN.get(pid)
    return None if child is None else child.poll()


class SpawnRefused(RuntimeError):
    """A start asked for after the sandbox began tearing down."""


class Spawner:
    """Starts processes and records them, one at a time; once closed (a
    tear-down under way) it starts none. A process whose recording fails
    is stopped again, by pid, before the error goes on: nothing else knows
    of it, so nothing else would ever stop it (a chaos run's restarts run
    in threads and may still be starting one while the run tears down)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.closed = False

    def start(self, record_it: Callable[[ProcessRecord], None], name: str, args: list[str],
              log: Path, **options: Any) -> ProcessRecord:
        with self._lock:
            if self.closed:
                raise SpawnRefused(f"not starting {name}: the sandbox is being torn down")
            record = spawn(name, args, log, **options)
            try:
                record_it(record)
            except BaseException:
                stop(record, timeout=5.0)
                raise
            return record

    def close(self) -> None:
        """Start nothing more (waits for a start under way to be recorded)."""
        with self._lock:
            self.closed = True

    def reopen(self) -> None:
        with self._lock:
            self.closed = False
