"""The sandbox's control plane: `Sandbox`, which starts, probes, uses and
stops it (what runs and how: the `arbiter.sandbox` package docstring).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from arbiter.sandbox import build, components, config, integrations, pki, process
from arbiter.sandbox.components import CONTROL_PLANE, repo_root
from arbiter.sandbox.config import NodeShape
from arbiter.sandbox.probe import (
    ComponentStatus,
    SandboxError,
    all_healthy,
    established,
    http_get,
    log_tails,
    probe_process,
    ready_count,
    unverified_context,
    verified_context,
    wait_until,
)
from arbiter.sandbox.process import KubectlError, ProcessRecord

DEFAULT_DIR = Path(".sandbox")
ARBITER_NAMESPACE = "arbiter-system"
ARBITER_PRIMARY = "arbiter"
STATE_VERSION = 2  # 2: arbiter's extender has a port of its own
_STATE_LOCK = threading.Lock()  # state.json is written whole, by one thread at a time
# Entries of DIR that the sandbox owns (`down`, a restart remove exactly these).
MANAGED_ENTRIES = ("state.json", "kubeconfig", "bin", "pki", "kubeconfigs", "etcd",
                   "scheduler.yaml", "arbiter-certs", "integrations")


class Sandbox:
    """One sandbox control plane, rooted at a directory (default `.sandbox`).

        sb = Sandbox(tmp_dir)
        sb.up(NodeShape(count=10, cpu="1", memory="8Gi"))   # arbiter=False: none
        sb.kubectl("get", "pods", "-A")                      # CompletedProcess[str]
        sb.apply_yaml(manifest_text)
        sb.kill_arbiter(); sb.start_arbiter()                # crash + restart, same port
        sb.start_arbiter(["--flag"], name="arbiter-2")       # a second replica, own port
        sb.down()

    A Sandbox made on an existing directory (e.g. by another process) reads
    its state.json and controls the same processes; exit statuses are known
    only for processes this Python process started.
    """

    def __init__(self, directory: Path | str = DEFAULT_DIR, *, quiet: bool = False) -> None:
        self.dir = Path(directory).resolve()
        self.quiet = quiet
        self._state: dict[str, Any] = self._load_state()
        self._spawner = process.Spawner()

    # ---- paths -----------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def kubectl_path(self) -> Path:
        return self.dir / "bin" / "kubectl"

    @property  # typed paths, one property each (see sandbox.pki.Pki)
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def arbiter_cert_dir(self) -> Path:
        return self.dir / "arbiter-certs"

    @property
    def pki(self) -> pki.Pki:
        return pki.Pki(self.dir / "pki")

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self._state['ports']['kube-apiserver']}"

    @property
    def arbiter_port(self) -> int | None:
        port = self._state.get("arbiter_port")
        return int(port) if port is not None else None

    @property
    def extender_port(self) -> int | None:
        """The primary arbiter's extender listener, which kube-scheduler calls."""
        port = self._state.get("extender_port")
        return int(port) if port is not None else None

    @property
    def node_shape(self) -> NodeShape:
        return NodeShape(**self._state.get("nodes", {}))

    def arbiter_url(self, name: str = ARBITER_PRIMARY, listener: str = "https") -> str:
        record = self.processes().get(name)
        if record is None or listener not in record.ports:
            raise SandboxError(f"no arbiter process named {name!r} in {self.dir}")
        return f"https://127.0.0.1:{record.ports[listener]}"

    def arbiter_metrics_url(self, name: str = ARBITER_PRIMARY) -> str:
        """The metrics listener of an arbiter process (/metrics, /debug/...)."""
        return self.arbiter_url(name, "metrics")

    # ---- state -----------------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if data.get("version") == STATE_VERSION else {}

    def _save_state(self) -> None:
        with _STATE_LOCK:  # a chaos run's injector threads record processes too
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.state_file.with_suffix(f".json.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(self._state, indent=2) + "\n")
            os.replace(tmp, self.state_file)

    def processes(self) -> dict[str, ProcessRecord]:
        raw: dict[str, Any] = self._state.get("processes", {})
        return {name: ProcessRecord.from_json(data) for name, data in raw.items()}

    def _record(self, record: ProcessRecord) -> None:
        with _STATE_LOCK:
            self._state.setdefault("processes", {})[record.name] = record.to_json()
        self._save_state()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One `up`/`down` at a time per directory."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with (self.dir / ".lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _say(self, message: str) -> None:
        if not self.quiet:
            print(f"[sandbox] {message}", file=sys.stderr, flush=True)

    # ---- bring-up --------------------------------------------------------

    def up(self, nodes: NodeShape | None = None, *, arbiter: bool = True,
           integrations: Sequence[str] = (), timeout: float = 180.0) -> bool:
        """Start everything; False if it already runs healthy (then only the
        `integrations` controllers it lacks are started).

        A sandbox in DIR that is partly dead is stopped and started afresh.
        On failure every started process is stopped again before raising.
        """
        shape = nodes or NodeShape()
        self._spawner.reopen()
        with self._locked():
            self._state = self._load_state()
            if self._state and self.processes():
                if self.healthy():
                    self._say(f"a healthy sandbox already runs in {self.dir}")
                    self.start_integrations(integrations, timeout)
                    return False
                self._say(f"found an unhealthy sandbox in {self.dir}: "
                          "stopping it and starting afresh")
            self._stop_all()
            self._remove_managed()
            try:
                self._bring_up(shape, arbiter, integrations, timeout)
            except BaseException:
                self._say(f"bring-up failed; stopping what was started "
                          f"(logs kept in {self.logs_dir})")
                self._stop_all()
                raise
            return True

    def _bring_up(self, shape: NodeShape, arbiter: bool, integration_names: Sequence[str],
                  timeout: float) -> None:
        started = time.monotonic()
        toolchain = build.ensure_built()
        names = [*CONTROL_PLANE, "etcd-peer"]
        ports = dict(zip(names, process.free_ports(len(names)), strict=True))
        arbiter_port, extender_port = process.free_ports(2) if arbiter else (None, None)
        self._state = {
            "version": STATE_VERSION,
            "toolchain": str(toolchain.root),
            "ports": ports,
            "arbiter_port": arbiter_port,
            "extender_port": extender_port,
            "nodes": dataclasses.asdict(shape),
            "processes": {},
        }
        self._save_state()
        self._write_files(toolchain)
        deadline = time.monotonic() + timeout

        self._start_etcd(toolchain)
        self._wait_healthy("etcd", deadline)
        self._start_apiserver(toolchain)
        self._wait("kube-apiserver /readyz", self._apiserver_ready, deadline)
        self._say(f"kube-apiserver ready after {time.monotonic() - started:.1f}s")

        ca_file: Path | None = None
        if arbiter_port is not None:
            ca_file = self._arbiter_certificates()
        self._start_controller_manager(toolchain)
        self.write_scheduler_config(
            components.scheduler_document(self.dir, self.pki, extender_port, ca_file))
        self._start_scheduler(toolchain)
        self._start_kwok(toolchain)
        launched = self._prepare_integrations(integration_names)
        self._install_crds([*sorted((repo_root() / "manifests" / "crds").glob("*.yaml")),
                            *(path for launch in launched for path in launch.crd_files)])
        self.apply_yaml(
            yaml.safe_dump(config.node_list(shape.count, shape.cpu, shape.memory, shape.gpu))
        )
        self._spawn_integrations(launched)
        if arbiter_port is not None:
            self.kubectl("create", "namespace", ARBITER_NAMESPACE)
            self.start_arbiter(wait_ready=False)
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self._wait_healthy(name, deadline)
        self._wait(f"{shape.count} Ready nodes", lambda: self.ready_nodes() >= shape.count,
                   deadline)
        if arbiter_port is not None:
            self._wait_healthy(ARBITER_PRIMARY, deadline)
        self._await_integrations(launched, deadline)
        self._state["up_seconds"] = round(time.monotonic() - started, 1)
        self._save_state()

    def _write_files(self, toolchain: build.Toolchain) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        components.write_client_files(
            pki.create_pki(self.dir / "pki"), self.apiserver_url,
            admin_kubeconfig=self.kubeconfig, kubeconfigs=self.dir / "kubeconfigs",
            kubectl_path=self.kubectl_path, kubectl_binary=toolchain.binary("kubectl"))

    def _spawn(self, name: str, args: list[str], *, ports: dict[str, int],
               health_url: str | None, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> ProcessRecord:
        return self._spawner.start(self._record, name, args, self.logs_dir / f"{name}.log",
                                   cwd=cwd or self.dir, env=env, ports=ports, health_url=health_url)

    def _spawn_https(self, name: str, args: list[str], port: int, health_path: str, *,
                     env: dict[str, str] | None = None, cwd: Path | None = None) -> ProcessRecord:
        """`_spawn` for a component serving HTTPS on 127.0.0.1:`port`, healthy at `health_path`."""
        return self._spawn(name, args, ports={"https": port},
                           health_url=f"https://127.0.0.1:{port}{health_path}", env=env, cwd=cwd)

    def _start_etcd(self, toolchain: build.Toolchain) -> None:
        client, peer = self._state["ports"]["etcd"], self._state["ports"]["etcd-peer"]
        args = components.etcd_args(toolchain.binary("etcd"), self.dir / "etcd", client, peer)
        self._spawn("etcd", args, ports={"client": client, "peer": peer},
                    health_url=f"http://127.0.0.1:{client}/health")

    def _start_apiserver(self, toolchain: build.Toolchain) -> None:
        port = self._state["ports"]["kube-apiserver"]
        args = components.apiserver_args(toolchain.binary("kube-apiserver"), self.pki,
                                         self._state["ports"]["etcd"], port)
        self._spawn_https("kube-apiserver", args, port, "/readyz")

    def _start_controller_manager(self, toolchain: build.Toolchain) -> None:
        port = self._state["ports"]["kube-controller-manager"]
        args = components.controller_manager_args(
            toolchain.binary("kube-controller-manager"), self.pki,
            self.dir / "kubeconfigs" / "kube-controller-manager.conf", port)
        self._spawn_https("kube-controller-manager", args, port, "/healthz")

    def write_scheduler_config(self, document: dict[str, Any]) -> Path:
        """Write the scheduler's configuration (takes effect at its next (re)start)."""
        path = self.dir / "scheduler.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    def scheduler_config(self) -> dict[str, Any]:
        """The scheduler configuration now written: adjust it, pass it to restart_scheduler."""
        document: dict[str, Any] = yaml.safe_load((self.dir / "scheduler.yaml").read_text())
        return document

    def _start_scheduler(self, toolchain: build.Toolchain) -> None:
        port = self._state["ports"]["kube-scheduler"]
        args = components.scheduler_args(toolchain.binary("kube-scheduler"),
                                         self.dir / "scheduler.yaml", port)
        self._spawn_https("kube-scheduler", args, port, "/healthz")

    def _start_kwok(self, toolchain: build.Toolchain) -> None:
        port = self._state["ports"]["kwok"]
        stages = components.sandbox_stages(toolchain.stage_files(), self.dir / "kwok-stages")
        args = components.kwok_args(toolchain.binary("kwok"),
                                    self.dir / "kubeconfigs" / "kwok.conf", port, stages)
        self._spawn("kwok", args, ports={"http": port},
                    health_url=f"http://127.0.0.1:{port}/healthz")

    def _install_crds(self, files: Sequence[Path], timeout: float = 60.0) -> None:
        if not files:
            return
        # Server-side apply: large CRDs overflow client-side apply's
        # last-applied annotation. One call for all: each kubectl costs ~0.5 s.
        applied = self.kubectl("apply", "--server-side", "--force-conflicts", "-o", "name",
                               *(f"--filename={path}" for path in files))
        names = [line.rpartition("/")[2] for line in applied.stdout.split()]
        # Polled, not `kubectl wait`: that fails on a CRD too new to have conditions.
        crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
        self._wait(f"CRDs {', '.join(names)} established",
                   lambda: all(established(self.api_get(crds + name)) for name in names),
                   time.monotonic() + timeout)

    # ---- integration controllers (`integrations`) -------------------------------

    def start_integrations(self, names: Sequence[str], timeout: float = 120.0) -> None:
        """Start the controllers in `names` not running yet, with CRDs and webhooks."""
        launches = self._prepare_integrations(names)
        self._install_crds([path for launch in launches for path in launch.crd_files])
        self._spawn_integrations(launches)
        self._await_integrations(launches, time.monotonic() + timeout)
        primary = self.processes().get(ARBITER_PRIMARY)
        if launches and primary is not None and process.is_running(primary):
            # Its --integrations lacks these kinds: restart it (same extra flags).
            self.stop_arbiter()
            self.start_arbiter(components.extra_arbiter_args(primary.args))

    def running(self) -> set[str]:
        """The names of the recorded processes that run."""
        return {name for name, record in self.processes().items() if process.is_running(record)}

    def _prepare_integrations(self, names: Sequence[str]) -> list[integrations.Launch]:
        running = self.running()
        return [integrations.prepare(name, self.dir / "integrations" / name, self.pki,
                                     self.dir / "kubeconfigs" / f"{name}.conf")
                for name in integrations.with_requirements(names) if name not in running]

    def _spawn_integrations(self, launches: Sequence[integrations.Launch]) -> None:
        for launch in launches:
            self._spawn(launch.name, launch.args, ports=launch.ports,
                        health_url=launch.health_url, env=launch.env)

    def _await_integrations(self, launches: Sequence[integrations.Launch], deadline: float) -> None:
        for launch in launches:
            self._wait(f"{launch.name} ready and serving its webhooks",
                       partial(integrations.serving, launch, self.pki.ca_cert),
                       deadline, watch=[launch.name])
            if text := launch.after_ready():  # none for KubeRay
                self.apply_yaml(text)
        if launches:
            self._say(f"started {', '.join(launch.name for launch in launches)}")

    def restart_scheduler(self, document: dict[str, Any] | None = None,
                          timeout: float = 60.0) -> int:
        """Restart kube-scheduler, optionally with a new configuration; returns its pid."""
        if document is not None:
            connection = document.setdefault("clientConnection", {})
            if not connection.get("kubeconfig"):
                connection["kubeconfig"] = str(self.dir / "kubeconfigs" / "kube-scheduler.conf")
            self.write_scheduler_config(document)
        old = self.processes()["kube-scheduler"]
        process.stop(old)
        self._start_scheduler(build.Toolchain(Path(self._state["toolchain"])))
        self._wait_healthy("kube-scheduler", time.monotonic() + timeout, watch=["kube-scheduler"])
        return self.processes()["kube-scheduler"].pid

    # ---- arbiter -----------------------------------------------------------

    def _arbiter_certificates(self) -> Path:
        """Arbiter's CA must exist before kube-scheduler starts (its extender trusts it)."""
        from certs import ensure_serving_certificate

        paths = ensure_serving_certificate(self.arbiter_cert_dir, ["localhost"], ["127.0.0.1"])
        return Path(paths.ca_file)

    def start_arbiter(self, extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                      name: str = ARBITER_PRIMARY, *, port: int | None = None,
                      wait_ready: bool = True, timeout: float = 60.0) -> int:
        """Start an arbiter server from this checkout; returns its pid.

        The primary (`name="arbiter"`) listens on the port the scheduler and
        the webhook configurations use. Other names are further replicas: they
        listen on `port` (default: the port that name had before, else a new
        free one) but are told the primary's webhook URL. All share one
        certificate directory, so every replica is trusted by the same CA.
        `env` is added to this process's environment.
        """
        primary = self.arbiter_port
        if primary is None:
            raise SandboxError("this sandbox was started without arbiter (--no-arbiter)")
        previous = self.processes().get(name)
        if previous is not None and process.is_running(previous):
            raise SandboxError(f"{name} already runs (pid {previous.pid})")
        if port is None:
            if name == ARBITER_PRIMARY:
                port = primary
            elif previous is not None and "https" in previous.ports:
                port = previous.ports["https"]
            else:
                port = process.free_port()
        extender_port = self.extender_port if name == ARBITER_PRIMARY else None
        if extender_port is None:
            extender_port = (previous.ports.get("extender") if previous is not None else None) \
                or process.free_port()
        metrics_port = (previous.ports.get("metrics") if previous is not None else None) \
            or process.free_port()
        self._arbiter_certificates()
        args = components.arbiter_args(
            extender_port=extender_port, metrics_port=metrics_port,
            client_ca=self.pki.ca_cert, port=port,
            kubeconfig=self.dir / "kubeconfigs" / "kube-arbiter.conf",
            cert_dir=self.arbiter_cert_dir, webhook_port=primary, namespace=ARBITER_NAMESPACE,
            integrations=integrations.arbiter_integrations(self.running()), extra_args=extra_args)
        record = self._spawn(name, args, ports={"https": port, "extender": extender_port,
                                                "metrics": metrics_port},
                             health_url=f"https://127.0.0.1:{port}/readyz",
                             env=components.arbiter_env(env), cwd=repo_root())
        if wait_ready:
            self._wait_healthy(name, time.monotonic() + timeout, watch=[name])
        return record.pid

    def stop_arbiter(self, name: str = ARBITER_PRIMARY, sig: int = signal.SIGTERM,
                     timeout: float = 15.0) -> int | None:
        """Send `sig` to an arbiter process and wait until it is gone.

        Returns its exit status when known (negative: killed by that signal).
        Only SIGTERM escalates to SIGKILL after `timeout`. The record stays,
        marked stopped, so `start_arbiter(name)` restarts it on the same port;
        a stopped replica no longer counts for `healthy()`, a stopped primary
        still does.
        """
        record = self.processes().get(name)
        if record is None:
            raise SandboxError(f"no arbiter process named {name!r}")
        record.stopped = True
        self._record(record)
        if process.signal_process(record, sig) and not process.wait_exit(record, timeout):
            if sig != signal.SIGTERM:
                raise SandboxError(
                    f"{name} (pid {record.pid}) still runs {timeout}s after signal {sig}"
                )
            process.signal_process(record, signal.SIGKILL)
            process.wait_exit(record, 5.0)
        return process.exit_code(record.pid)

    def kill_arbiter(self, name: str = ARBITER_PRIMARY) -> int | None:
        """SIGKILL an arbiter process (a crash, as far as the cluster can tell)."""
        return self.stop_arbiter(name, signal.SIGKILL)

    # ---- health ------------------------------------------------------------

    def _admin_context(self) -> ssl.SSLContext:
        """TLS to the apiserver as the sandbox's admin (system:masters)."""
        keys = self.pki
        return verified_context(keys.ca_cert, keys.client_cert("admin"), keys.client_key("admin"))

    def _context_for(self, record: ProcessRecord) -> ssl.SSLContext | None:
        if record.health_url is None or not record.health_url.startswith("https"):
            return None
        if record.name == "kube-apiserver":
            return self._admin_context()
        if record.name in CONTROL_PLANE:
            return unverified_context()
        return verified_context(self.arbiter_cert_dir / "ca.crt")

    def _probe(self, record: ProcessRecord) -> tuple[bool, str]:
        return probe_process(record, lambda: self._context_for(record))

    def _wait_healthy(self, name: str, deadline: float, watch: Sequence[str] | None = None) -> None:
        record = self.processes()[name]
        self._wait(f"{name} health", lambda: self._probe(record)[0], deadline, watch)

    def _apiserver_ready(self) -> bool:
        return self._probe(self.processes()["kube-apiserver"])[0]

    def api_get(self, path: str) -> Any:
        """GET an apiserver path as the admin; the decoded JSON body."""
        status, body = http_get(self.apiserver_url + path, self._admin_context(), timeout=10.0)
        if status != 200:
            raise SandboxError(
                f"GET {path}: status {status}: {body[:300].decode(errors='replace')}"
            )
        return json.loads(body)

    def ready_nodes(self) -> int:
        label = f"{config.NODE_LABEL[0]}%3D{config.NODE_LABEL[1]}"
        try:
            return ready_count(self.api_get(f"/api/v1/nodes?labelSelector={label}"))
        except SandboxError:
            return 0

    def status(self) -> list[ComponentStatus]:
        result = []
        for name, record in self.processes().items():
            healthy, detail = self._probe(record)
            running = process.is_running(record)
            if record.stopped and not running:
                detail = f"stopped on purpose ({detail})"
            result.append(ComponentStatus(
                name=name, pid=record.pid, running=running, healthy=healthy, detail=detail,
                log=record.log, ports=record.ports,
                required=not (record.stopped and name != ARBITER_PRIMARY)))
        return result

    def healthy(self) -> bool:
        """Every process that counts healthy and all fake nodes Ready.

        Further arbiter replicas stopped with `stop_arbiter`/`kill_arbiter`
        do not count; the primary and every control-plane process do.
        """
        if not all_healthy(self.status()):
            return False
        return self.ready_nodes() >= self.node_shape.count

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each running sandbox process."""
        records = self.processes()
        return {name: process.rss_bytes(records[name].pid) for name in self.running()}

    def _wait(self, what: str, check: Callable[[], bool], deadline: float,
              watch: Sequence[str] | None = None) -> None:
        wait_until(what, check, deadline, self.processes, watch)

    # ---- use -----------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run the sandbox's kubectl against it; output captured as text."""
        if not self._state:
            raise SandboxError(f"no sandbox state in {self.dir}: run `arbiter sandbox up` first")
        kubectl = build.Toolchain(Path(self._state["toolchain"])).binary("kubectl")
        cmd = [str(kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, cmd, result.stdout, result.stderr)
        return result

    def apply_yaml(self, text: str, *,
                   server_side: bool = False) -> subprocess.CompletedProcess[str]:
        """`kubectl apply -f -` with `text` (one or more YAML/JSON documents)."""
        args = ["apply", "-f", "-"]
        if server_side:
            args += ["--server-side", "--force-conflicts"]
        return self.kubectl(*args, input=text)

    def log_tails(self, lines: int = 40) -> str:
        """The last `lines` lines of every component's log, for failure reports."""
        return log_tails(self.processes(), self.logs_dir, lines)

    # ---- tear-down -------------------------------------------------------------

    def _stop_all(self) -> None:
        # Reverse start order: arbiter and the controllers go before the
        # apiserver (so they do not spin on connection errors), etcd last.
        for record in reversed(list(self.processes().values())):
            process.stop(record)

    def _remove_managed(self) -> None:
        for entry in MANAGED_ENTRIES:
            path = self.dir / entry
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def down(self) -> list[str]:
        """Stop every recorded process (by pid), remove the sandbox's files but
        its logs; the names of the processes that were still running."""
        self._spawner.close()  # a start under way in another thread is recorded first
        with self._locked():
            self._state = self._load_state()
            was_running = sorted(self.running(), key=list(self.processes()).index)
            self._stop_all()
            if survivors := self.running():
                raise SandboxError(f"could not stop: {', '.join(sorted(survivors))}")
            self._remove_managed()
            self._state = {}
            return was_running
