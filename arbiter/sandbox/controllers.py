"""Controller managers built from their Go modules into the sandbox's
version-keyed cache: Kueue's (for bench/compare_kueue.py), and the
integrations the sandbox runs (`integrations`): JobSet's, LeaderWorkerSet's,
KubeRay's and Kubeflow Trainer's.

Each is pinned by a wrapper module (go.mod + go.sum with `tool` directives:
`sandbox/kueue/`, `sandbox/controllers/` for the integrations together) and
built once per machine:

    <cache root>/<name>-<version>_<hash>/
        bin/<name>                  the manager, its version stamped in
        manifests/crds/*.yaml       its CRDs, copied from the module
        manifests/webhooks.yaml     its webhook configurations, with the
                                    module's kustomize patches applied
                                    (absent when it serves none here)
        manifests/extra/*.yaml      objects it needs, from the module
                                    (Trainer's torch-distributed runtime)
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
    webhooks: str  # controller-gen's webhook manifests, before kustomize; "" for none
    # kustomize JSON patches of those manifests, by the kind they target.
    webhook_patches: tuple[tuple[str, str], ...] = ()
    extras: tuple[str, ...] = ()  # further manifests to copy, relative to the module root
    cold_build: str = "minutes"  # what a cold build takes here, for the progress line
    recipe: int = 1  # bump when the build or the manifest edits change

    @property
    def wrapper_dir(self) -> Path:
        return source_dir() / self.wrapper

    def pinned_version(self) -> str:
        return _required_version(self.wrapper_dir / "go.mod", self.module)

    def cache_key(self, version: str, go_version: str) -> str:
        digest = hashlib.sha256(f"{self.recipe}\n{go_version}".encode())
        # The module files and any Go source of the wrapper's own (KubeRay's main).
        sources = sorted(self.wrapper_dir.rglob("*.go"))
        for path in (self.wrapper_dir / "go.mod", self.wrapper_dir / "go.sum", *sources):
            digest.update(str(path.relative_to(self.wrapper_dir)).encode() + b"\0")
            digest.update(path.read_bytes())
        return f"{self.name}-{version}_{digest.hexdigest()[:12]}"


KUEUE = GoController(
    name="kueue", wrapper="kueue", module="sigs.k8s.io/kueue",
    package="sigs.k8s.io/kueue/cmd/kueue",
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
# KubeRay's reconcilers from the wrapper's own main (sandbox/controllers/cmd/
# kuberay: KubeRay's main imports its webhook package, which does not compile
# with the controller-runtime the others need). Its webhooks are off unless
# ENABLE_WEBHOOKS is set, as in upstream's default install: none is served.
KUBERAY = GoController(
    name="kuberay", wrapper="controllers", module="github.com/ray-project/kuberay/ray-operator",
    package="./cmd/kuberay", crd_dir="config/crd/bases",
    webhooks="", cold_build="2-4 minutes once JobSet's is built")
TRAINER = GoController(
    name="trainer", wrapper="controllers", module="github.com/kubeflow/trainer/v2",
    package="github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
    crd_dir="manifests/base/crds", webhooks="manifests/base/webhook/manifests.yaml",
    webhook_patches=(
        ("MutatingWebhookConfiguration", "manifests/base/webhook/patch_mutating.yaml"),
        ("ValidatingWebhookConfiguration", "manifests/base/webhook/patch_validating.yaml"),
    ), extras=("manifests/base/runtimes/torch_distributed.yaml",),
    cold_build="2-4 minutes once JobSet's is built")


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
    def extra_files(self) -> list[Path]:
        return sorted((self.root / "manifests" / "extra").glob("*.yaml"))

    @property
    def version(self) -> str:
        info: dict[str, str] = json.loads((self.root / "build.json").read_text())
        return info["version"]

    def complete(self) -> bool:
        return (self.root / "build.json").is_file() and self.binary.is_file()


def patched_webhooks(documents: list[dict[str, Any]],
                     patches: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """`documents` with kustomize's JSON patches applied, as its overlay would.

    Only what the modules' patches do is supported: `replace` of a value
    that is there (one webhook, e.g. to add the pod webhooks' objectSelector,
    without which they would see every pod of the cluster; a name) and `add`
    of an object's member (Trainer's objectSelectors). Anything else fails
    the build, so a new upstream shape is noticed rather than half applied.
    """
    for kind, operations in patches:
        targets = [d for d in documents if d.get("kind") == kind]
        if len(targets) != 1:
            raise BuildError(f"webhook patch for {kind}: {len(targets)} documents of that kind")
        for operation in operations:
            if not _patched(targets[0], operation):
                raise BuildError(f"webhook patch for {kind}: unsupported operation {operation}")
    return documents


def _patched(document: dict[str, Any], operation: dict[str, Any]) -> bool:
    """Apply one `add` (object member) or `replace` (existing value) JSON patch
    operation to `document` in place; False (nothing changed) for any other."""
    op, path = operation.get("op"), str(operation.get("path", ""))
    *parents, last = path.split("/")[1:] if path.startswith("/") else [""]
    target: Any = document
    for step in parents:
        if isinstance(target, dict) and step in target:
            target = target[step]
        elif isinstance(target, list) and step.isdigit() and int(step) < len(target):
            target = target[int(step)]
        else:
            return False
    if isinstance(target, dict) and last and (op == "add" or (op == "replace" and last in target)):
        target[last] = operation["value"]
        return True
    if isinstance(target, list) and op == "replace" and last.isdigit() and int(last) < len(target):
        target[int(last)] = operation["value"]
        return True
    return False


def _copy_manifests(go: str, controller: GoController, target: Path) -> None:
    module = _module_dir(go, controller.wrapper_dir, controller.module)
    crds = target / "crds"
    crds.mkdir(parents=True)
    for path in sorted((module / controller.crd_dir).glob("*.yaml")):
        # The folder may hold its kustomization.yaml beside the CRDs.
        if _kinds(path) == {"CustomResourceDefinition"}:
            shutil.copyfile(path, crds / path.name)
    if not any(crds.iterdir()):
        raise BuildError(f"no CRDs in {module / controller.crd_dir}")
    if controller.extras:
        (target / "extra").mkdir()
    for name in controller.extras:
        shutil.copyfile(module / name, target / "extra" / Path(name).name)
    if not controller.webhooks:
        return
    documents = [d for d in yaml.safe_load_all((module / controller.webhooks).read_text()) if d]
    patches = [(kind, yaml.safe_load((module / path).read_text()))
               for kind, path in controller.webhook_patches]
    (target / "webhooks.yaml").write_text(
        yaml.safe_dump_all(patched_webhooks(documents, patches), sort_keys=False))


def _kinds(path: Path) -> set[str]:
    # A CRD file is large (a megabyte): its kinds are found without parsing it.
    return {line.split(":", 1)[1].strip() for line in path.read_text().splitlines()
            if line.startswith("kind:")}


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
