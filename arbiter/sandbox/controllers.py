"""Controller managers built from their Go modules into the sandbox's
version-keyed cache: Kueue's (for bench/compare_kueue.py), JobSet's and
LeaderWorkerSet's (the integrations the sandbox runs, `integrations`).

Each is pinned by a wrapper module (go.mod + go.sum with `tool` directives:
`sandbox/kueue/`, `sandbox/controllers/` for JobSet and LWS together) and
built once per machine:

    <cache root>/<name>-<version>_<hash>/
        bin/<name>                  the manager, its version stamped in
        manifests/crds/*.yaml       its CRDs, copied from the module
        manifests/webhooks.yaml     its webhook configurations, with the
                                    module's kustomize patches applied
        build.json                  version, size and build time

The key hashes the wrapper module (go.mod, go.sum), the recipe and the Go
toolchain, as for the control-plane binaries (`build`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from arbiter.sandbox.build import (
    BuildError,
    _go_version,
    _module_dir,
    _progress,
    _required_version,
    _run,
    cache_root,
    go_binary,
    publish,
    source_dir,
    staging,
)


@dataclass(frozen=True, slots=True)
class GoController:
    """Where a controller manager and its manifests live in its Go module."""

    name: str  # the cache entry's prefix, the binary's name
    wrapper: str  # the wrapper module's folder in sandbox/
    module: str
    package: str  # the manager's main package
    crd_dir: str  # relative to the module root
    webhooks: str  # controller-gen's webhook manifests, before kustomize
    # kustomize JSON patches of those manifests, by the kind they target.
    webhook_patches: tuple[tuple[str, str], ...] = ()
    cold_build: str = "minutes"  # what a cold build takes here, for the progress line
    recipe: int = 1  # bump when the build or the manifest edits change

    @property
    def wrapper_dir(self) -> Path:
        return source_dir() / self.wrapper

    def pinned_version(self) -> str:
        return _required_version(self.wrapper_dir / "go.mod", self.module)

    def cache_key(self, version: str, go_version: str) -> str:
        digest = hashlib.sha256(f"{self.recipe}\n{go_version}".encode())
        for name in ("go.mod", "go.sum"):
            digest.update((self.wrapper_dir / name).read_bytes())
        return f"{self.name}-{version}_{digest.hexdigest()[:12]}"


KUEUE = GoController(
    name="kueue", wrapper="kueue", module="sigs.k8s.io/kueue", package="sigs.k8s.io/kueue/cmd/kueue",
    crd_dir="config/components/crd/bases",
    webhooks="config/components/webhook/manifests.yaml", cold_build="7-19 minutes")
# JobSet and LWS share one wrapper module, so one dependency graph: a cold
# build compiles client-go and controller-runtime once for both.
JOBSET = GoController(
    name="jobset", wrapper="controllers", module="sigs.k8s.io/jobset", package="sigs.k8s.io/jobset",
    crd_dir="config/components/crd/bases",
    webhooks="config/components/webhook/manifests.yaml",
    webhook_patches=(
        ("MutatingWebhookConfiguration", "config/components/webhook/patches/mutating-patch.yaml"),
        ("ValidatingWebhookConfiguration",
         "config/components/webhook/patches/validating-patch.yaml"),
    ), cold_build="6-10 minutes on two busy cores")
LWS = GoController(
    name="lws", wrapper="controllers", module="sigs.k8s.io/lws", package="sigs.k8s.io/lws/cmd",
    crd_dir="config/crd/bases", webhooks="config/webhook/manifests.yaml",
    webhook_patches=(
        ("MutatingWebhookConfiguration", "config/webhook/mutating-patch.yaml"),
        ("ValidatingWebhookConfiguration", "config/webhook/validating-patch.yaml"),
    ), cold_build="under a minute once JobSet's is built")


@dataclass(frozen=True, slots=True)
class ControllerBuild:
    """One cached build of a `GoController`."""

    root: Path
    name: str

    @property
    def binary(self) -> Path:
        return self.root / "bin" / self.name

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


def patched_webhooks(documents: list[dict[str, Any]],
                     patches: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """`documents` with kustomize's JSON patches applied, as its overlay would.

    Only what the modules' patches do is supported (`replace` of one
    webhook, e.g. to add the pod webhooks' objectSelector, without which they
    would see every pod of the cluster); anything else fails the build, so a
    new upstream shape is noticed rather than half applied.
    """
    for kind, operations in patches:
        targets = [d for d in documents if d.get("kind") == kind]
        if len(targets) != 1:
            raise BuildError(f"webhook patch for {kind}: {len(targets)} documents of that kind")
        hooks = targets[0]["webhooks"]
        for operation in operations:
            prefix, _, index = str(operation.get("path", "")).rpartition("/")
            if operation.get("op") != "replace" or prefix != "/webhooks" or not index.isdigit() \
                    or int(index) >= len(hooks):
                raise BuildError(f"webhook patch for {kind}: unsupported operation {operation}")
            hooks[int(index)] = operation["value"]
    return documents


def _copy_manifests(go: str, controller: GoController, target: Path) -> None:
    module = _module_dir(go, controller.wrapper_dir, controller.module)
    crds = target / "crds"
    crds.mkdir(parents=True)
    for path in sorted((module / controller.crd_dir).glob("*.yaml")):
        shutil.copyfile(path, crds / path.name)
    if not any(crds.iterdir()):
        raise BuildError(f"no CRDs in {module / controller.crd_dir}")
    documents = [d for d in yaml.safe_load_all((module / controller.webhooks).read_text()) if d]
    patches = [(kind, yaml.safe_load((module / path).read_text()))
               for kind, path in controller.webhook_patches]
    (target / "webhooks.yaml").write_text(
        yaml.safe_dump_all(patched_webhooks(documents, patches), sort_keys=False))


def ensure_controller_built(controller: GoController, *, force: bool = False) -> ControllerBuild:
    """The cached build of `controller`, made first when it is not there yet."""
    if not (controller.wrapper_dir / "go.mod").is_file():
        raise BuildError(f"no wrapper module for {controller.name} in {controller.wrapper_dir}")
    go = go_binary()
    version = controller.pinned_version()
    # The same cache steps as build.ensure_built (key, found, staging,
    # publish) over another module: staging/publish are shared; the key differs.
    key = controller.cache_key(version, _go_version(go))
    root = cache_root()
    found = ControllerBuild(root / key, controller.name)
    if found.complete() and not force:
        return found
    with staging(root, key) as staged:
        log = staged / "build.log"
        binary = staged / "bin" / controller.name
        binary.parent.mkdir()
        started = time.monotonic()
        _progress(f"building {controller.name} {version} into {found.root} (log: {log}); "
                  f"a cold build takes {controller.cold_build}")
        ldflags = f"-s -w -X {controller.module}/pkg/version.GitVersion={version}"
        _run([go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(binary),
              controller.package], controller.wrapper_dir, log)
        _copy_manifests(go, controller, staged / "manifests")
        summary = {
            "key": key, "version": version, "total_seconds": round(time.monotonic() - started, 1),
            "size_mib": round(binary.stat().st_size / 2**20, 1),
        }
        publish(staged, summary, found.root, found.complete)
        _progress(f"built {controller.name} in {summary['total_seconds']:.0f}s: {found.binary}")
        return found
