"""Kueue's manager, built from the wrapper module `sandbox/kueue/` into the
sandbox's version-keyed cache, for `bench/compare_kueue.py` only (never the
default test command: a cold build takes 7-19 minutes on two cores).

    <cache root>/kueue-<version>_<hash>/
        bin/kueue                   the manager (`sigs.k8s.io/kueue/cmd/kueue`)
        manifests/crds/*.yaml       its CRDs, from the module's config/components/crd/bases
        manifests/webhooks.yaml     its webhook configurations, before kustomize
        build.json                  version, size and build time

The key hashes the wrapper module (go.mod, go.sum) and the Go toolchain, as
for the control-plane binaries; `arbiter sandbox build --with kueue` fills it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from arbiter.sandbox.build import (
    BuildError,
    _go_version,
    _module_dir,
    _progress,
    _required_version,
    _run,
    cache_root,
    go_binary,
    new_staging,
    publish,
    source_dir,
)

MODULE = "sigs.k8s.io/kueue"
RECIPE = 1


@dataclass(frozen=True, slots=True)
class KueueBuild:
    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "kueue"

    @property
    def crd_files(self) -> list[Path]:
        return sorted((self.root / "manifests" / "crds").glob("*.yaml"))

    @property
    def webhooks_file(self) -> Path:
        return self.root / "manifests" / "webhooks.yaml"

    @property
    def version(self) -> str:
        info: dict[str, str] = json.loads((self.root / "build.json").read_text())
        return info["version"]

    def complete(self) -> bool:
        return (self.root / "build.json").is_file() and self.binary.is_file()


def wrapper_dir() -> Path:
    return source_dir() / "kueue"


def pinned_version() -> str:
    return _required_version(wrapper_dir() / "go.mod", MODULE)


def cache_key(version: str, go_version: str) -> str:
    digest = hashlib.sha256(f"{RECIPE}\n{go_version}".encode())
    for name in ("go.mod", "go.sum"):
        digest.update((wrapper_dir() / name).read_bytes())
    return f"kueue-{version}_{digest.hexdigest()[:12]}"


def _copy_manifests(go: str, target: Path) -> None:
    module = _module_dir(go, wrapper_dir(), MODULE) / "config" / "components"
    crds = target / "crds"
    crds.mkdir(parents=True)
    for path in sorted((module / "crd" / "bases").glob("*.yaml")):
        shutil.copyfile(path, crds / path.name)
    shutil.copyfile(module / "webhook" / "manifests.yaml", target / "webhooks.yaml")


def ensure_kueue_built(*, force: bool = False) -> KueueBuild:
    """The cached Kueue build, made first when it is not there yet."""
    if not (wrapper_dir() / "go.mod").is_file():
        raise BuildError(f"no Kueue wrapper module in {wrapper_dir()}")
    go = go_binary()
    version = pinned_version()
    # The same cache steps as build.build (key, found, staging, publish), over
    # another module: the shared parts are new_staging/publish; the key differs.
    key = cache_key(version, _go_version(go))
    root = cache_root()
    found = KueueBuild(root / key)
    if found.complete() and not force:
        return found
    staging = new_staging(root, key)
    try:
        log = staging / "build.log"
        (staging / "bin").mkdir()
        started = time.monotonic()
        _progress(f"building Kueue {version} into {found.root} (log: {log}); "
                  "a cold build takes 7-19 minutes")
        ldflags = f"-s -w -X {MODULE}/pkg/version.GitVersion={version}"
        _run([go, "build", "-trimpath", "-ldflags", ldflags, "-o",
              str(staging / "bin" / "kueue"), f"{MODULE}/cmd/kueue"], wrapper_dir(), log)
        _copy_manifests(go, staging / "manifests")
        summary = {
            "key": key, "version": version, "total_seconds": round(time.monotonic() - started, 1),
            "size_mib": round((staging / "bin" / "kueue").stat().st_size / 2**20, 1),
        }
        publish(staging, summary, found.root, found.complete)
        _progress(f"built Kueue in {summary['total_seconds']:.0f}s: {found.binary}")
        return found
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)

