"""Benchmark: slow clients against the listeners (issue #25 row 8).

A server child process runs `arbiter.server.app.start_listeners` (all three TLS
listeners, uvloop, as `arbiter serve` does) on 127.0.0.1 with a synced
in-memory cache. This process then opens `--plain` slow TCP clients (they
connect and trickle one byte every `--interval` seconds, never finishing a
TLS handshake) and `--tls` slow TLS clients (they finish the handshake and
trickle a request head one byte at a time) against the webhook port, from
a process of their own, the plain ones from 127.0.0.2 and the TLS ones
from 127.0.0.3 (an attacker's pods); a client the server closes waits one
interval and connects again. Meanwhile this process sends a normal review
(`kubectl run` pod, mutating webhook) from 127.0.0.1 every 0.25 s on a
fresh TLS connection, the way a new apiserver connection would.

Printed: the server's RSS before the slow clients and its peak during
them, the normal reviews' latency (p50, p99, max) and failures, and how
many connections the server closed by reason (its own counter). Loopback
only; it stops after `--seconds`. Exit status 1 when RSS growth reaches
50 MiB, a normal review fails, or one takes 100 ms or more.

    .venv/bin/python bench/slow_clients.py [--plain 3000] [--tls 2000] [--seconds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_webhook import bodies, percentile
from bench.fuzz_surfaces import _status_kib

RAMP_SECONDS = 10.0


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def _serve(port_out: Any, stop: Any, cert_dir: str, fds: int) -> None:
    _raise_fd_limit(fds)
    import uvloop

    from arbiter.base.metrics import REGISTRY
    from arbiter.server.app import start_listeners
    from arbiter.server.config import ServeConfig
    from arbiter.server.context import ServerContext
    from bench.bench_webhook import build_store
    from certs.manager import CertManager

    async def main() -> None:
        config = ServeConfig(host="127.0.0.1", port=0, extender_port=0, metrics_port=0,
                             cert_dir=Path(cert_dir))
        certs = CertManager(config.cert_dir, ["localhost"], ["127.0.0.1"])
        ctx = ServerContext(config=config, store=build_store(), certs=certs)
        runners = await start_listeners(ctx, await certs.prepare(), background=False)
        port_out.send(runners["webhook"].addresses[0][1])
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        closed = {sample.labels["reason"]: int(sample.value)
                  for metric in REGISTRY.collect()
                  if metric.name == "arbiter_listener_connections_closed"
                  for sample in metric.samples
                  if sample.name.endswith("_total") and sample.labels["listener"] == "webhook"}
        port_out.send(closed)
        for runner in runners.values():
            await runner.cleanup()

    uvloop.run(main())


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Tally:
    def __init__(self) -> None:
        self.connects = 0
        self.closed_by_server = 0
        self.connect_errors = 0


async def _slow_client(port: int, tls: ssl.SSLContext | None, interval: float,
                       until: float, delay: float, tally: Tally) -> None:
    await asyncio.sleep(delay)
    source = ("127.0.0.3" if tls else "127.0.0.2", 0)
    trickle = b"POST /webhook/mutate/pods HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4096
    while time.monotonic() < until:
        try:
            async with asyncio.timeout(max(0.1, until - time.monotonic())):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=tls, local_addr=source)
        except (OSError, ssl.SSLError, TimeoutError):
            tally.connect_errors += 1
            await asyncio.sleep(interval)
            continue
        tally.connects += 1
        try:
            for byte in trickle:
                writer.write(bytes([byte if tls else 0x16]))
                try:
                    async with asyncio.timeout(max(0.0, min(interval, until - time.monotonic()))):
                        if not await reader.read(1024):
                            tally.closed_by_server += 1
                            break
                except TimeoutError:
                    if time.monotonic() >= until:
                        return
        except (OSError, ssl.SSLError):
            tally.closed_by_server += 1
        finally:
            writer.close()
        await asyncio.sleep(interval)


async def _normal_reviews(port: int, tls: ssl.SSLContext, until: float,
                          latencies: list[float], failures: list[str]) -> None:
    body = bodies(1)[0]
    request = (b"POST /webhook/mutate/pods?timeout=10s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: application/json\r\nConnection: close\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    while time.monotonic() < until:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(5):
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
                writer.write(request)
                answer = await reader.read()
                writer.close()
            if not answer.startswith(b"HTTP/1.1 200") or b'"allowed":true' not in answer:
                failures.append(answer[:120].decode(errors="replace"))
        except (OSError, ssl.SSLError, TimeoutError) as error:
            failures.append(repr(error))
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(0.25)


def _slow_process(port: int, ca_file: str, args: argparse.Namespace, start_at: float,
                  out: Any, fds: int) -> None:
    _raise_fd_limit(fds)
    import uvloop

    async def run() -> Tally:
        # A client whose connection the server cut mid-write is expected here.
        asyncio.get_running_loop().set_exception_handler(lambda _loop, _context: None)
        tls = ssl.create_default_context(cafile=ca_file)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        until = time.monotonic() + args.seconds
        tally = Tally()
        total = args.plain + args.tls
        await asyncio.gather(*(_slow_client(
            port, tls if index >= args.plain else None, args.interval, until,
            RAMP_SECONDS * index / total, tally) for index in range(total)))
        return tally

    tally = uvloop.run(run())
    out.send((tally.connects, tally.closed_by_server, tally.connect_errors))


async def _probe(port: int, ca_file: str, seconds: float, latencies: list[float],
                 failures: list[str]) -> None:
    await _normal_reviews(port, ssl.create_default_context(cafile=ca_file),
                          time.monotonic() + seconds, latencies, failures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plain", type=int, default=3000)
    parser.add_argument("--tls", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    fds = 2 * (args.plain + args.tls) + 1024
    _raise_fd_limit(fds)
    context = mp.get_context("spawn")
    receive, send = context.Pipe()
    stop = context.Event()
    with tempfile.TemporaryDirectory() as cert_dir:
        server = context.Process(target=_serve, args=(send, stop, cert_dir, fds), daemon=True)
        server.start()
        try:
            port = receive.recv()
            assert server.pid is not None
            import uvloop

            ca_file = str(Path(cert_dir) / "ca.crt")
            baseline_latencies: list[float] = []
            failures: list[str] = []
            uvloop.run(_probe(port, ca_file, 2.0, baseline_latencies, failures))
            baseline = _status_kib(server.pid, "VmRSS")
            cpu_before = _cpu_seconds(server.pid)
            tally_in, tally_out = context.Pipe(duplex=False)
            slow = context.Process(target=_slow_process, daemon=True, args=(
                port, ca_file, args, time.time() + 1.0, tally_out, fds))
            started = time.monotonic()
            slow.start()
            latencies: list[float] = []
            uvloop.run(_probe(port, ca_file, args.seconds + 1.0, latencies, failures))
            connects, closed_by_server, connect_errors = tally_in.recv()
            slow.join(timeout=30)
            elapsed = time.monotonic() - started
            server_cpu = _cpu_seconds(server.pid) - cpu_before
            peak = _status_kib(server.pid, "VmHWM")
            final = _status_kib(server.pid, "VmRSS")
            stop.set()
            closed = receive.recv() if receive.poll(30) else {}
        finally:
            stop.set()
            server.join(timeout=30)
            if server.is_alive():
                server.terminate()
    growth = (peak - baseline) / 1024
    worst = max(latencies) if latencies else float("inf")
    print(f"slow clients: {args.plain} plain + {args.tls} TLS, one byte per {args.interval:g} s, "
          f"ramped over {RAMP_SECONDS:g} s, {elapsed:.0f} s in all; {connects} "
          f"connections opened, {closed_by_server} closed by the server, "
          f"{connect_errors} failed to connect")
    print("server closed (webhook listener): " + (", ".join(
        f"{reason} {count}" for reason, count in sorted(closed.items())) or "none"))
    print(f"server RSS: {baseline / 1024:.1f} MiB before, peak {peak / 1024:.1f} MiB, "
          f"final {final / 1024:.1f} MiB; growth {growth:.1f} MiB (goal < 50)")
    print(f"server CPU {server_cpu:.1f} s in {elapsed:.0f} s; machine load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if baseline_latencies:
        print(f"normal review alone (fresh TLS connection): "
              f"p50 {percentile(baseline_latencies, 0.5) * 1e3:.1f} ms")
    if latencies:
        print(f"normal review meanwhile ({len(latencies)}, fresh TLS connection each): "
              f"p50 {percentile(latencies, 0.5) * 1e3:.1f} ms, "
              f"p99 {percentile(latencies, 0.99) * 1e3:.1f} ms, max {worst * 1e3:.1f} ms "
              f"(goal < 100); failed {len(failures)}")
    settled = latencies[int(len(latencies) * (RAMP_SECONDS + 1.0) / (args.seconds + 1.0)):]
    if settled:
        print(f"  after the {RAMP_SECONDS:g} s ramp ({len(settled)}): "
              f"p50 {percentile(settled, 0.5) * 1e3:.1f} ms, "
              f"p99 {percentile(settled, 0.99) * 1e3:.1f} ms, max {max(settled) * 1e3:.1f} ms")
    for failure in failures[:5]:
        print(f"  {failure}")
    return 1 if growth >= 50 or failures or worst >= 0.1 else 0


if __name__ == "__main__":
    sys.exit(main())
