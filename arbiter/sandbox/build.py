"""Build the sandbox's control-plane binaries from the Go wrapper modules in `sandbox/`.

Binaries go into a cache directory outside git, keyed by the pinned versions
and a hash of the wrapper modules (go.mod, go.sum, Go sources) and the Go
toolchain, so a machine pays for a build once:

    $ARBITER_SANDBOX_CACHE (default ~/.cache/kube-arbiter/sandbox)/<key>/
        bin/{etcd,kube-apiserver,kube-controller-manager,kube-scheduler,kubectl,kwok}
        kwok-stages/*.yaml      Stage documents copied from kwok's module
        build.json              versions, sizes and build time

A build goes to a temporary sibling directory that is renamed into place when
complete, so a crash never leaves a half-filled cache entry behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CACHE_ENV = "ARBITER_SANDBOX_CACHE"
# Bump when the build flags or the stage adjustments below change, so caches rebuild.
RECIPE = 2
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)
# kwok's Stage documents, by (path under its kustomize/stage/, name written).
# pod-complete comes from the "general" set because only that one reads the
# per-pod delay annotation; the others are the instant "fast" variants.
KWOK_STAGES = (
    ("node/fast/node-initialize.yaml", "node-initialize.yaml"),
    ("node/heartbeat/node-heartbeat.yaml", "node-heartbeat.yaml"),
    ("pod/fast/pod-ready.yaml", "pod-ready.yaml"),
    ("pod/general/pod-complete.yaml", "pod-complete.yaml"),
    ("pod/fast/pod-delete.yaml", "pod-delete.yaml"),
)


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Versions:
    kubernetes: str
    etcd: str
    kwok: str


# Typed paths, one property each (see sandbox.pki.Pki).
@dataclass(frozen=True, slots=True)
class Toolchain:
    """Where the cached binaries and kwok stage files of one build live."""

    root: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def stages_dir(self) -> Path:
        return self.root / "kwok-stages"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    def stage_files(self) -> list[Path]:
        return sorted(self.stages_dir.glob("*.yaml"))

    def complete(self) -> bool:
        return (self.root / "build.json").is_file() and all(
            self.binary(name).is_file() for name in BINARIES
        )


def source_dir() -> Path:
    """The `sandbox/` directory of this checkout (the Go wrapper modules)."""
    return Path(__file__).resolve().parents[2] / "sandbox"


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kube-arbiter" / "sandbox"


def _required_version(go_mod: Path, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.M)
    if match is None:
        raise BuildError(f"{go_mod}: no require line for {module}")
    return match.group(1)


def pinned_versions(src: Path | None = None) -> Versions:
    src = src or source_dir()
    return Versions(
        kubernetes=_required_version(src / "k8s" / "go.mod", "k8s.io/kubernetes"),
        etcd=_required_version(src / "etcd" / "go.mod", "go.etcd.io/etcd/server/v3"),
        kwok=_required_version(src / "kwok" / "go.mod", "sigs.k8s.io/kwok"),
    )


def go_binary() -> str:
    found = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if found is None:
        raise BuildError(
            "the Go toolchain (`go`) is needed to build the sandbox; install Go >= 1.26"
        )
    return found


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(CGO_ENABLED="0", GOTOOLCHAIN="local")
    # Read-only module mode with the committed go.sum: a build never edits go.mod.
    env["GOFLAGS"] = "-mod=readonly -buildvcs=false"
    return env


def _go_version(go: str) -> str:
    result = subprocess.run(
        [go, "version"], capture_output=True, text=True, check=True, env=go_env()
    )
    return result.stdout.strip()


def _hashed_files(src: Path) -> list[Path]:
    files: list[Path] = []
    for module in ("k8s", "etcd", "kwok"):
        root = src / module
        files += [root / "go.mod", root / "go.sum"]
        files += sorted(root.rglob("*.go"))
    return [f for f in files if f.is_file()]


def cache_key(versions: Versions, src: Path, go_version: str) -> str:
    """`k8s-<v>_etcd-<v>_kwok-<v>_<hash>`: readable versions plus a content hash."""
    digest = hashlib.sha256(f"{RECIPE}\n{go_version}".encode())
    for path in _hashed_files(src):
        digest.update(str(path.relative_to(src)).encode())
        digest.update(path.read_bytes())
    return (
        f"k8s-{versions.kubernetes}_etcd-{versions.etcd}_kwok-{versions.kwok}"
        f"_{digest.hexdigest()[:12]}"
    )


def _kube_ldflags(version: str) -> str:
    """Stamp the release version, as Kubernetes' own build does, so /version is truthful."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _run(cmd: list[str], cwd: Path, log: Path) -> None:
    with log.open("ab") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        result = subprocess.run(cmd, cwd=cwd, env=go_env(), stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise BuildError(f"`{' '.join(cmd)}` failed in {cwd} (exit {result.returncode}):\n{tail}")


def _module_dir(go: str, module_root: Path, module: str) -> Path:
    result = subprocess.run(
        [go, "mod", "download", "-json", module],
        cwd=module_root,
        env=go_env(),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise BuildError(
            f"go mod download {module}: {result.stderr.strip() or result.stdout.strip()}"
        )
    info: dict[str, Any] = json.loads(result.stdout)
    return Path(info["Dir"])


class _BlockDumper(yaml.SafeDumper):
    """Dumps multi-line strings (the stages' Go templates) as readable `|` blocks."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _represent_str)


def stage_document(text: str, file_name: str) -> str:
    """Adjust one kwok Stage document for the sandbox.

    kwok computes a stage's delay as: jitter <= delay ? jitter : delay + rand(jitter - delay).
    The upstream pod-complete stage has a fixed 5 s default jitter, so a
    `pod-complete.stage.kwok.x-k8s.io/delay: 5m` annotation would complete the
    pod after 5 s. Dropping the default jitter makes the delay annotation
    exact (jitter stays available through the jitter-delay annotation).
    Other stages are copied unchanged.
    """
    if file_name != "pod-complete.yaml":
        return text
    document = yaml.safe_load(text)
    document["spec"].get("delay", {}).pop("jitterDurationMilliseconds", None)
    return yaml.dump(document, Dumper=_BlockDumper, sort_keys=False)


def _copy_stages(go: str, src: Path, target: Path) -> None:
    kwok_dir = _module_dir(go, src / "kwok", "sigs.k8s.io/kwok")
    target.mkdir(parents=True, exist_ok=True)
    for relative, name in KWOK_STAGES:
        origin = kwok_dir / "kustomize" / "stage" / relative
        if not origin.is_file():
            raise BuildError(f"kwok stage {relative} not found under {kwok_dir}")
        (target / name).write_text(stage_document(origin.read_text(), name))


def _progress(message: str) -> None:
    print(f"[sandbox build] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def staging(root: Path, key: str) -> Iterator[Path]:
    """A fresh temporary sibling of the cache entry `key`, where a build goes
    first; removed afterwards unless `publish` renamed it into place."""
    root.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        yield directory
    finally:
        if directory.exists():
            shutil.rmtree(directory, ignore_errors=True)


def publish(staging: Path, summary: dict[str, Any], target: Path,
            complete: Callable[[], bool]) -> None:
    """Write the build's summary and rename it into its cache entry. A
    previous incomplete entry (or a concurrent builder's) is replaced;
    losing the race to a builder that finished first is fine."""
    (staging / "build.json").write_text(json.dumps(summary, indent=2) + "\n")
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    try:
        staging.rename(target)
    except OSError:
        if not complete():
            raise


def ensure_built(*, force: bool = False) -> Toolchain:
    """Return the cached toolchain, building it first if it is not there yet."""
    src = source_dir()
    if not (src / "k8s" / "go.mod").is_file():
        raise BuildError(f"Go wrapper modules not found in {src}: run from a kube-arbiter checkout")
    go = go_binary()
    versions = pinned_versions(src)
    go_version = _go_version(go)
    key = cache_key(versions, src, go_version)
    root = cache_root()
    toolchain = Toolchain(root / key)
    if toolchain.complete() and not force:
        return toolchain
    with staging(root, key) as staged:
        partial = Toolchain(staged)
        partial.bin_dir.mkdir()
        log = staged / "build.log"
        started = time.monotonic()
        timings: dict[str, float] = {}
        steps: list[tuple[str, Path, list[str]]] = [
            ("etcd", src / "etcd", ["-ldflags", "-s -w", "./cmd/etcd"]),
            ("kwok", src / "kwok", ["-ldflags", "-s -w", "sigs.k8s.io/kwok/cmd/kwok"]),
            (
                "kubernetes",
                src / "k8s",
                ["-ldflags", _kube_ldflags(versions.kubernetes), "./cmd/..."],
            ),
        ]
        _progress(f"building {key} into {toolchain.root} (log: {log}); a cold build takes minutes")
        for label, module_root, args in steps:
            _progress(f"go build {label} ...")
            step_started = time.monotonic()
            output = str(partial.bin_dir) + os.sep
            _run([go, "build", "-trimpath", "-o", output, *args], module_root, log)
            timings[label] = round(time.monotonic() - step_started, 1)
            _progress(f"go build {label} done in {timings[label]:.0f}s")
        _copy_stages(go, src, partial.stages_dir)
        missing = [name for name in BINARIES if not partial.binary(name).is_file()]
        if missing:
            raise BuildError(f"build finished without {', '.join(missing)} (see {log})")
        summary = {
            "key": key,
            "versions": {
                "kubernetes": versions.kubernetes,
                "etcd": versions.etcd,
                "kwok": versions.kwok,
            },
            "go": go_version,
            "seconds": timings,
            "total_seconds": round(time.monotonic() - started, 1),
            "sizes_mib": {
                name: round(partial.binary(name).stat().st_size / 2**20, 1) for name in BINARIES
            },
        }
        publish(staged, summary, toolchain.root, toolchain.complete)
        _progress(f"built in {summary['total_seconds']:.0f}s: {toolchain.bin_dir}")
        return toolchain
