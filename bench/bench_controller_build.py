"""Cold build of the integration controllers (issue #29's budget: the
controllers add at most 10 minutes to a cold sandbox build).

Builds JobSet, LWS, KubeRay and Trainer (in the order `arbiter sandbox
build` does) into a fresh sandbox cache with an empty Go build cache, so
every package is compiled again. The Go module cache is kept by default:
downloading modules is network time, not the machine's; `--cold-modules`
empties it too. Prints, per controller and in all: wall time, the CPU time
of the Go toolchain (user + system of the children), and the load average
before and after (other work on the machine shows there).

    .venv/bin/python -m bench.bench_controller_build
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from arbiter.sandbox.controllers import JOBSET, KUBERAY, LWS, TRAINER, ensure_controller_built


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-modules", action="store_true",
                        help="an empty Go module cache too (downloads every module)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="arbiter-build-bench-"))
    os.environ["ARBITER_SANDBOX_CACHE"] = str(scratch / "sandbox")
    os.environ["GOCACHE"] = str(scratch / "gocache")
    if args.cold_modules:
        os.environ["GOMODCACHE"] = str(scratch / "gomodcache")
    print(f"machine: {os.cpu_count()} CPUs; load before {os.getloadavg()[0]:.2f}; "
          f"module cache {'empty' if args.cold_modules else 'kept'}; build cache empty")
    rows: list[tuple[str, float, float]] = []
    started, cpu_started = time.monotonic(), children_cpu()
    try:
        for controller in (JOBSET, LWS, KUBERAY, TRAINER):
            wall, cpu = time.monotonic(), children_cpu()
            ensure_controller_built(controller)
            rows.append((f"{controller.name} {controller.pinned_version()}",
                         time.monotonic() - wall, children_cpu() - cpu))
    finally:
        if not args.keep:
            # Go makes its module cache read-only.
            for root, dirs, _ in os.walk(scratch):
                for name in dirs:
                    os.chmod(os.path.join(root, name), 0o755)
            shutil.rmtree(scratch, ignore_errors=True)
    rows.append(("all four", time.monotonic() - started, children_cpu() - cpu_started))
    print(f"{'controller':<32} {'wall':>9} {'CPU':>9}")
    for name, wall, cpu in rows:
        print(f"{name:<32} {wall / 60:>7.1f} m {cpu / 60:>7.1f} m")
    print(f"load after {os.getloadavg()[0]:.2f} (1-minute average)")


if __name__ == "__main__":
    main()
