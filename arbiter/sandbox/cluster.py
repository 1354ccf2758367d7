"""A real local Kubernetes control plane for tests, demos and trying arbiter out.

`Sandbox(directory).up(...)` starts, each as a detached background process
logging to `DIR/logs/<component>.log`:

- etcd (plain HTTP on loopback, data in `DIR/etcd`),
- kube-apiserver (RBAC + Node authorization, service accounts, admission
  webhooks on; serving on a free port of 127.0.0.1),
- kube-controller-manager (job, garbage collector, namespace, service
  account and service-account token controllers; no node lifecycle, so fake
  nodes never get evicted),
- kube-scheduler (with arbiter as its extender unless `arbiter=False`;
  see `config.scheduler_config`),
- kwok, faking N nodes and their pods' lifecycles,
- the arbiter server from this checkout (`python -m arbiter serve`).

Then it installs `manifests/crds/*.yaml`, creates the fake nodes and waits
until everything is healthy and every node is Ready. `DIR/state.json`
records pids and ports so another process (`arbiter sandbox down`) can stop
exactly what was started.

Pod lifecycles under kwok: a pod bound to a fake node turns Running/Ready at
once. A pod owned by a Job then completes (phase Succeeded) after the
duration in its annotation `pod-complete.stage.kwok.x-k8s.io/delay` (Go
duration: "2s", "5m"; 1 s without the annotation), so a test keeps a Job's
pods running as long as it needs by setting that annotation in the Job's pod
template. Pods not owned by a Job run until deleted; a deleted pod is
removed at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from arbiter.sandbox import build, config, pki, process
from arbiter.sandbox.process import ProcessRecord

DEFAULT_DIR = Path(".sandbox")
ARBITER_NAMESPACE = "arbiter-system"
ARBITER_PRIMARY = "arbiter"
ARBITER_COMMAND_ENV = "ARBITER_SANDBOX_ARBITER_COMMAND"
STATE_VERSION = 1
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KCM_CONTROLLERS = (
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "ttl-after-finished-controller",
)
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Entries of DIR that the sandbox owns: `down` and a restart remove exactly
# these (never the directory itself, which may be a user's directory).
MANAGED_ENTRIES = (
    "state.json",
    "kubeconfig",
    "bin",
    "pki",
    "kubeconfigs",
    "etcd",
    "scheduler.yaml",
    "arbiter-certs",
)


class SandboxError(RuntimeError):
    pass


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call; unlike CalledProcessError, str() includes stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr or ''}".rstrip()


@dataclass(frozen=True, slots=True)
class NodeShape:
    count: int = 4
    cpu: str = "8"
    memory: str = "32Gi"
    gpu: int = 0


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


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def arbiter_command() -> list[str]:
    """How to run `arbiter`: this interpreter on this checkout, unless
    ARBITER_SANDBOX_ARBITER_COMMAND says otherwise (e.g. to run it under
    coverage: "python -m coverage run --parallel-mode -m arbiter")."""
    configured = os.environ.get(ARBITER_COMMAND_ENV, "").strip()
    return shlex.split(configured) if configured else [sys.executable, "-m", "arbiter"]


def _verified_context(
    ca_file: Path, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_file))
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def _unverified_context() -> ssl.SSLContext:
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

    # ---- paths -----------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def kubectl_path(self) -> Path:
        return self.dir / "bin" / "kubectl"

    @property
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
    def node_shape(self) -> NodeShape:
        return NodeShape(**self._state.get("nodes", {}))

    def arbiter_url(self, name: str = ARBITER_PRIMARY) -> str:
        record = self.processes().get(name)
        if record is None or "https" not in record.ports:
            raise SandboxError(f"no arbiter process named {name!r} in {self.dir}")
        return f"https://127.0.0.1:{record.ports['https']}"

    # ---- state -----------------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if data.get("version") == STATE_VERSION else {}

    def _save_state(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self._state, indent=2) + "\n")
        os.replace(tmp, self.state_file)

    def processes(self) -> dict[str, ProcessRecord]:
        raw: dict[str, Any] = self._state.get("processes", {})
        return {name: ProcessRecord.from_json(data) for name, data in raw.items()}

    def _record(self, record: ProcessRecord) -> None:
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

    def up(
        self,
        nodes: NodeShape | None = None,
        *,
        arbiter: bool = True,
        timeout: float = 180.0,
    ) -> bool:
        """Start everything; False (and nothing done) if it already runs healthy.

        A sandbox in DIR that is partly dead is stopped and started afresh.
        On failure every started process is stopped again before raising.
        """
        shape = nodes or NodeShape()
        with self._locked():
            self._state = self._load_state()
            if self._state and self.processes():
                if self.healthy():
                    self._say(f"a healthy sandbox already runs in {self.dir}; nothing to do")
                    return False
                self._say(
                    f"found an unhealthy sandbox in {self.dir}: stopping it and starting afresh"
                )
            self._stop_all()
            self._remove_managed()
            try:
                self._bring_up(shape, arbiter, timeout)
            except BaseException:
                self._say(
                    f"bring-up failed; stopping what was started (logs kept in {self.logs_dir})"
                )
                self._stop_all()
                raise
            return True

    def _bring_up(self, shape: NodeShape, arbiter: bool, timeout: float) -> None:
        started = time.monotonic()
        toolchain = build.ensure_built()
        names = [*CONTROL_PLANE, "etcd-peer"]
        ports = dict(zip(names, process.free_ports(len(names)), strict=True))
        arbiter_port = process.free_port() if arbiter else None
        self._state = {
            "version": STATE_VERSION,
            "toolchain": str(toolchain.root),
            "ports": ports,
            "arbiter_port": arbiter_port,
            "nodes": {
                "count": shape.count,
                "cpu": shape.cpu,
                "memory": shape.memory,
                "gpu": shape.gpu,
            },
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
        self._write_scheduler_config(arbiter_port, ca_file)
        self._start_scheduler(toolchain)
        self._start_kwok(toolchain)
        self._install_crds()
        self.apply_yaml(
            yaml.safe_dump(config.node_list(shape.count, shape.cpu, shape.memory, shape.gpu))
        )
        if arbiter_port is not None:
            self.kubectl("create", "namespace", ARBITER_NAMESPACE)
            self.start_arbiter(wait_ready=False)
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self._wait_healthy(name, deadline)
        self._wait(
            f"{shape.count} Ready nodes", lambda: self.ready_nodes() >= shape.count, deadline
        )
        if arbiter_port is not None:
            self._wait_healthy(ARBITER_PRIMARY, deadline)
        self._state["up_seconds"] = round(time.monotonic() - started, 1)
        self._save_state()

    def _write_files(self, toolchain: build.Toolchain) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        keys = pki.create_pki(self.dir / "pki")
        server = f"https://127.0.0.1:{self._state['ports']['kube-apiserver']}"
        kubeconfigs = self.dir / "kubeconfigs"
        kubeconfigs.mkdir(exist_ok=True)
        for name, (user, _groups) in pki.CLIENTS.items():
            document = config.kubeconfig(
                server, keys.ca_cert, keys.client_cert(name), keys.client_key(name), user
            )
            target = self.kubeconfig if name == "admin" else kubeconfigs / f"{name}.conf"
            target.write_text(yaml.safe_dump(document))
            target.chmod(0o600)
        bin_dir = self.dir / "bin"
        bin_dir.mkdir(exist_ok=True)
        # A wrapper, not a symlink: it defaults to this sandbox's kubeconfig
        # even when KUBECONFIG points at a real cluster (--kubeconfig still wins).
        wrapper = (
            "#!/bin/sh\n"
            f"KUBECONFIG='{self.kubeconfig}' exec '{toolchain.binary('kubectl')}' \"$@\"\n"
        )
        self.kubectl_path.write_text(wrapper)
        self.kubectl_path.chmod(0o755)

    def _spawn(
        self,
        name: str,
        args: list[str],
        *,
        ports: dict[str, int],
        health_url: str | None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ProcessRecord:
        record = process.spawn(
            name,
            args,
            self.logs_dir / f"{name}.log",
            cwd=cwd or self.dir,
            env=env,
            ports=ports,
            health_url=health_url,
        )
        self._record(record)
        return record

    def _spawn_https(
        self,
        name: str,
        args: list[str],
        port: int,
        health_path: str,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ProcessRecord:
        """`_spawn` for a component serving HTTPS on 127.0.0.1:`port`, healthy at `health_path`."""
        return self._spawn(
            name,
            args,
            ports={"https": port},
            health_url=f"https://127.0.0.1:{port}{health_path}",
            env=env,
            cwd=cwd,
        )

    def _start_etcd(self, toolchain: build.Toolchain) -> None:
        client, peer = self._state["ports"]["etcd"], self._state["ports"]["etcd-peer"]
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        args = [
            str(toolchain.binary("etcd")),
            "--name=sandbox",
            f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=sandbox={peer_url}",
            # A throwaway cluster: skipping fsync makes every write (and so
            # every test) much faster; durability across crashes is not wanted.
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ]
        self._spawn(
            "etcd", args, ports={"client": client, "peer": peer}, health_url=f"{client_url}/health"
        )

    def _start_apiserver(self, toolchain: build.Toolchain) -> None:
        keys = self.pki
        port = self._state["ports"]["kube-apiserver"]
        args = [
            str(toolchain.binary("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{self._state['ports']['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={keys.apiserver_cert}",
            f"--tls-private-key-file={keys.apiserver_key}",
            f"--client-ca-file={keys.ca_cert}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={keys.sa_pub}",
            f"--service-account-signing-key-file={keys.sa_key}",
            f"--service-cluster-ip-range={pki.SERVICE_CIDR}",
            # The default reconciler publishes the advertise address as the
            # `kubernetes` Service's endpoint, and loopback addresses are
            # invalid there: it would log an error every 10 s. Nothing in the
            # sandbox reaches the apiserver through that Service.
            "--endpoint-reconciler-type=none",
            # This plugin taints every new Node not-ready; only the node
            # lifecycle controller (deliberately not run here) would lift it.
            "--disable-admission-plugins=TaintNodesByCondition",
            "--allow-privileged=true",
            "--profiling=false",
        ]
        self._spawn_https("kube-apiserver", args, port, "/readyz")

    def _start_controller_manager(self, toolchain: build.Toolchain) -> None:
        keys = self.pki
        port = self._state["ports"]["kube-controller-manager"]
        args = [
            str(toolchain.binary("kube-controller-manager")),
            f"--kubeconfig={self.dir / 'kubeconfigs' / 'kube-controller-manager.conf'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--controllers={','.join(KCM_CONTROLLERS)}",
            "--leader-elect=false",
            # Each controller acts as its own service account with the RBAC
            # role upstream gives it, as in a real cluster.
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={keys.sa_key}",
            f"--root-ca-file={keys.ca_cert}",
            # Client-side throttling (default 20 qps) would make the Job
            # controller, not the system under test, the bottleneck.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--concurrent-job-syncs=10",
            "--profiling=false",
        ]
        self._spawn_https("kube-controller-manager", args, port, "/healthz")

    def _write_scheduler_config(self, arbiter_port: int | None, ca_file: Path | None) -> None:
        extender = None if arbiter_port is None else f"https://127.0.0.1:{arbiter_port}/scheduler"
        document = config.scheduler_config(
            extender,
            None if ca_file is None else str(ca_file),
            kubeconfig_path=str(self.dir / "kubeconfigs" / "kube-scheduler.conf"),
        )
        self.write_scheduler_config(document)

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
        args = [
            str(toolchain.binary("kube-scheduler")),
            f"--config={self.dir / 'scheduler.yaml'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--profiling=false",
        ]
        self._spawn_https("kube-scheduler", args, port, "/healthz")

    def _start_kwok(self, toolchain: build.Toolchain) -> None:
        port = self._state["ports"]["kwok"]
        args = [
            str(toolchain.binary("kwok")),
            f"--kubeconfig={self.dir / 'kubeconfigs' / 'kwok.conf'}",
            f"--manage-nodes-with-annotation-selector={config.KWOK_NODE_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{port}",
            "--node-ip=127.0.0.1",
            # At INFO kwok logs every node and pod patch: megabytes per test run.
            "--v=WARN",
        ]
        args += [f"--config={stage}" for stage in toolchain.stage_files()]
        self._spawn(
            "kwok", args, ports={"http": port}, health_url=f"http://127.0.0.1:{port}/healthz"
        )

    def _install_crds(self) -> None:
        crd_dir = repo_root() / "manifests" / "crds"
        files = sorted(crd_dir.glob("*.yaml")) if crd_dir.is_dir() else []
        if not files:
            self._say(f"no CRDs in {crd_dir} yet; skipping")
            return
        for path in files:
            # Server-side apply: large CRDs overflow client-side apply's
            # last-applied annotation.
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        self._say(f"installed {len(files)} CRD file(s) from {crd_dir}")

    def restart_scheduler(
        self, document: dict[str, Any] | None = None, timeout: float = 60.0
    ) -> int:
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

    def start_arbiter(
        self,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        name: str = ARBITER_PRIMARY,
        *,
        port: int | None = None,
        wait_ready: bool = True,
        timeout: float = 60.0,
    ) -> int:
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
        self._arbiter_certificates()
        args = [
            *arbiter_command(),
            "serve",
            "--kubeconfig",
            str(self.dir / "kubeconfigs" / "kube-arbiter.conf"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--cert-dir",
            str(self.arbiter_cert_dir),
            "--webhook-url",
            f"https://127.0.0.1:{primary}",
            "--namespace",
            ARBITER_NAMESPACE,
            *extra_args,
        ]
        child_env = dict(os.environ)
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(repo_root()), child_env.get("PYTHONPATH", "")) if p
        )
        child_env["PYTHONUNBUFFERED"] = "1"
        child_env.update(env or {})
        record = self._spawn_https(name, args, port, "/readyz", env=child_env, cwd=repo_root())
        if wait_ready:
            self._wait_healthy(name, time.monotonic() + timeout, watch=[name])
        return record.pid

    def stop_arbiter(
        self, name: str = ARBITER_PRIMARY, sig: int = signal.SIGTERM, timeout: float = 15.0
    ) -> int | None:
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
        return _verified_context(keys.ca_cert, keys.client_cert("admin"), keys.client_key("admin"))

    def _context_for(self, record: ProcessRecord) -> ssl.SSLContext | None:
        if record.health_url is None or not record.health_url.startswith("https"):
            return None
        if record.name == "kube-apiserver":
            return self._admin_context()
        if record.name in CONTROL_PLANE:
            return _unverified_context()
        return _verified_context(self.arbiter_cert_dir / "ca.crt")

    def _probe(self, record: ProcessRecord) -> tuple[bool, str]:
        """(healthy, detail) for one process: running and its health URL answers 200."""
        if not process.is_running(record):
            code = process.exit_code(record.pid)
            return False, "not running" if code is None else f"exited with status {code}"
        if record.health_url is None:
            return True, "running"
        try:
            context = self._context_for(record)
        except (OSError, ssl.SSLError) as error:
            return False, f"no TLS context: {error}"
        status, body = http_get(record.health_url, context, timeout=3.0)
        if status == 200:
            return True, f"{record.health_url} ok"
        if status == 0:
            return False, f"{record.health_url} does not answer"
        return (
            False,
            f"{record.health_url} answered {status}: {body[:200].decode(errors='replace')}",
        )

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
            nodes = self.api_get(f"/api/v1/nodes?labelSelector={label}")
        except SandboxError:
            return 0
        ready = 0
        for node in nodes.get("items", []):
            conditions = node.get("status", {}).get("conditions", [])
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                ready += 1
        return ready

    def status(self) -> list[ComponentStatus]:
        result = []
        for name, record in self.processes().items():
            healthy, detail = self._probe(record)
            running = process.is_running(record)
            if record.stopped and not running:
                detail = f"stopped on purpose ({detail})"
            result.append(
                ComponentStatus(
                    name=name,
                    pid=record.pid,
                    running=running,
                    healthy=healthy,
                    detail=detail,
                    log=record.log,
                    ports=record.ports,
                    required=not (record.stopped and name != ARBITER_PRIMARY),
                )
            )
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
        return {
            name: process.rss_bytes(record.pid)
            for name, record in self.processes().items()
            if process.is_running(record)
        }

    def _wait(
        self,
        what: str,
        check: Callable[[], bool],
        deadline: float,
        watch: Sequence[str] | None = None,
    ) -> None:
        """Poll `check` until true; fail fast when a watched process (default: all) has died."""
        while True:
            if check():
                return
            for name, record in self.processes().items():
                if record.stopped and watch is None:
                    continue
                if (watch is None or name in watch) and not process.is_running(record):
                    raise SandboxError(
                        f"{record.name} exited while waiting for {what}; "
                        f"last lines of {record.log}:\n{_tail(Path(record.log), 40)}"
                    )
            if time.monotonic() > deadline:
                raise SandboxError(f"timed out waiting for {what}")
            time.sleep(0.2)

    # ---- use -----------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the sandbox's kubectl against it; output captured as text."""
        if not self._state:
            raise SandboxError(f"no sandbox state in {self.dir}: run `arbiter sandbox up` first")
        kubectl = build.Toolchain(Path(self._state["toolchain"])).binary("kubectl")
        cmd = [str(kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, cmd, result.stdout, result.stderr)
        return result

    def apply_yaml(
        self, text: str, *, server_side: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl apply -f -` with `text` (one or more YAML/JSON documents)."""
        args = ["apply", "-f", "-"]
        if server_side:
            args += ["--server-side", "--force-conflicts"]
        return self.kubectl(*args, input=text)

    def log_tails(self, lines: int = 40) -> str:
        """The last `lines` lines of every component's log, for failure reports."""
        logs = {name: Path(r.log) for name, r in self.processes().items()}
        if not logs and self.logs_dir.is_dir():
            logs = {p.stem: p for p in sorted(self.logs_dir.glob("*.log"))}
        parts = [
            f"===== {name} ({path}) =====\n{_tail(path, lines)}" for name, path in logs.items()
        ]
        return "\n".join(parts)

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
        """Stop every recorded process (by pid) and remove the sandbox's files but its logs.

        Returns the names of the processes that were still running.
        """
        with self._locked():
            self._state = self._load_state()
            was_running = [n for n, r in self.processes().items() if process.is_running(r)]
            self._stop_all()
            survivors = [n for n, r in self.processes().items() if process.is_running(r)]
            if survivors:
                raise SandboxError(f"could not stop: {', '.join(survivors)}")
            self._remove_managed()
            self._state = {}
            return was_running


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 200 * lines))
            text = handle.read().decode(errors="replace")
    except OSError as error:
        return f"(no log: {error})"
    return "\n".join(text.splitlines()[-lines:])
