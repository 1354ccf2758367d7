"""The faults of a chaos run, carried out on a live sandbox: the two arbiter
replicas (killed and restarted with a fresh identity each time, as a new pod
would be), the apiserver restarted, etcd stopped, and the replicas'
connections to the apiserver cut at the proxy they go through.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import yaml

from arbiter.sandbox import Sandbox, faults
from arbiter.sandbox.chaos_proxy import ProxyProcess
from bench.chaos_world import Fault

T = TypeVar("T")
REPLICAS = ("arbiter", "arbiter-b")
RESTART_AFTER = 5.0
ETCD_STOP = 10.0
PROXY_CUT = 20.0


@dataclass(slots=True)
class Done:
    fault: Fault
    started: float = 0.0  # monotonic
    ended: float = 0.0
    detail: str = ""
    error: str = ""


@dataclass(slots=True)
class Replica:
    name: str
    port: int
    incarnation: int = 0
    pids: list[int] = field(default_factory=list)

    @property
    def identity(self) -> str:
        return f"{self.name}-{self.incarnation}"


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


def replica_of(identity: str) -> str:
    return identity.rpartition("-")[0]


def faster_kwok(sandbox: Sandbox, parallelism: int = 32) -> None:
    """Restart kwok playing up to `parallelism` pod stages at once (its
    default, 4, makes kwok, not arbiter, the bottleneck of a flood: each
    pod is patched twice, Running then Succeeded)."""
    path = sandbox.dir / "kwok-chaos.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
        "options": {"podPlayStageParallelism": parallelism,
                    "nodePlayStageParallelism": max(4, parallelism // 4)}}))
    faults.restart_component(sandbox, "kwok", extra_args=[f"--config={path}"])


def proxied_kubeconfig(sandbox: Sandbox, proxy_port: int) -> Path:
    """arbiter's kubeconfig, pointed at the proxy instead of the apiserver
    (the apiserver's certificate names 127.0.0.1, so TLS still verifies)."""
    source = sandbox.dir / "kubeconfigs" / "kube-arbiter.conf"
    document = yaml.safe_load(source.read_text())
    for cluster in document["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{proxy_port}"
    target = sandbox.dir / "kubeconfigs" / "kube-arbiter-chaos.conf"
    target.write_text(yaml.safe_dump(document))
    target.chmod(0o600)
    return target


class Injector:
    """Starts the replicas and carries out each fault, recording what was done."""

    def __init__(self, sandbox: Sandbox, kubeconfig: Path, proxy: ProxyProcess,
                 holder: Callable[[], str], extra_args: list[str]) -> None:
        self.sandbox = sandbox
        self.kubeconfig = kubeconfig
        self.proxy = proxy
        self.holder = holder
        self.extra_args = extra_args
        self.replicas: dict[str, Replica] = {}
        self.done: list[Done] = []
        self.kills: list[tuple[float, str]] = []  # (monotonic, identity killed) of leaders
        self.etcd_paused = False
        # Blocking sandbox calls run here, not in asyncio's default executor:
        # an interrupted run must not wait for them before tearing down.
        self.executor = ThreadPoolExecutor(4, thread_name_prefix="chaos")

    async def blocking(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, partial(function, *args, **kwargs))

    def start_replica(self, replica: Replica, *, wait: bool) -> None:
        args = ["--kubeconfig", str(self.kubeconfig), "--identity", replica.identity,
                *self.extra_args]
        pid = self.sandbox.start_arbiter(args, name=replica.name, port=replica.port,
                                         wait_ready=wait, timeout=180.0)
        replica.pids.append(pid)

    async def leader(self, within: float = 40.0) -> Replica | None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            name = replica_of(self.holder())
            if name in self.replicas:
                return self.replicas[name]
            await asyncio.sleep(0.2)
        return None

    async def run(self, plan: list[Fault], start: float) -> None:
        for fault in plan:
            await asyncio.sleep(max(0.0, start + fault.at - time.monotonic()))
            record = Done(fault, started=time.monotonic())
            self.done.append(record)
            try:
                record.detail = await self._inject(fault.kind, record)
            except Exception as error:  # a fault that could not be injected is reported
                record.error = f"{type(error).__name__}: {error}"
            record.ended = time.monotonic()
            say(f"{fault.kind} at +{record.started - start:.0f}s: "
                  f"{record.detail or record.error}")

    async def _inject(self, kind: str, record: Done) -> str:
        if kind in ("leader-kill", "follower-kill"):
            return await self._kill(kind == "leader-kill", record)
        if kind == "apiserver-restart":
            await self.blocking(faults.restart_component, self.sandbox, "kube-apiserver")
            return "kube-apiserver restarted"
        if kind == "etcd-stop":
            faults.pause(self.sandbox, "etcd")
            self.etcd_paused = True
            try:
                await asyncio.sleep(ETCD_STOP)
            finally:
                faults.resume(self.sandbox, "etcd")
                self.etcd_paused = False
            return f"etcd stopped for {ETCD_STOP:.0f}s"
        if kind == "proxy-cut":
            cut = self.proxy.cut()
            try:
                await asyncio.sleep(PROXY_CUT)
            finally:
                self.proxy.restore()
            return f"{cut} connection(s) cut, refused for {PROXY_CUT:.0f}s"
        raise ValueError(f"unknown fault {kind!r}")

    async def _kill(self, leader: bool, record: Done) -> str:
        current = await self.leader()
        if current is None:
            raise RuntimeError("no replica holds the Lease")
        victim = current if leader else next(
            r for r in self.replicas.values() if r.name != current.name)
        # The Lease names the holder as arbiter made it unique (identity_suffix).
        identity = self.holder() if leader else victim.identity
        record.started = time.monotonic()
        await self.blocking(self.sandbox.stop_arbiter, victim.name, signal.SIGKILL)
        if leader:
            self.kills.append((record.started, identity))
        await asyncio.sleep(RESTART_AFTER)
        victim.incarnation += 1
        await self.blocking(self.start_replica, victim, wait=False)
        return f"SIGKILL {identity}, restarted as {victim.identity}"

    def abandon(self) -> None:
        """After the run (or an interruption): etcd must not stay stopped,
        and blocking calls still running are not waited for."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.etcd_paused:
            faults.resume(self.sandbox, "etcd")
            self.etcd_paused = False
