"""The image's install steps, run for real in a clean virtualenv.

There is no container engine on our machines, so this test does what the
Dockerfile's build stage does, step by step and read from the Dockerfile
itself: copy what its COPY lines copy into a fresh build directory, run its
RUN lines there (the same `pip wheel` and scripts/install-runtime.sh), then
use the virtualenv the final stage ships. If the Dockerfile forgets a
package, or the install pulls in test tools, this fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.dockerfile import ROOT, stages

# Paths the Dockerfile uses inside the image, mapped into the test's directory.
IMAGE_PATHS = ("/opt/arbiter", "/dist", "/src")
TEST_ONLY = {"pytest", "pytest-asyncio", "pytest-timeout", "hypothesis", "ruff", "mypy",
             "types-pyyaml"}
RUNTIME = {"aiohttp", "kubernetes-asyncio", "cryptography", "orjson", "prometheus-client",
           "uvloop", "pyyaml", "kube-arbiter"}

DRF_PAPER = """
capacity: {cpu: "9", memory: 18Gi}
queues:
  - name: A
    units:
      - {count: 10, requests: {cpu: "1", memory: 4Gi}}
  - name: B
    units:
      - {count: 10, requests: {cpu: "3", memory: 1Gi}}
"""


@dataclass(frozen=True, slots=True)
class Built:
    root: Path
    venv: Path
    wheel: Path

    def run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ARBITER_", "PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run(list(args), capture_output=True, text=True, cwd=self.root,
                              env=env, timeout=timeout)


def _image_path(root: Path, value: str) -> str:
    for image_path in IMAGE_PATHS:
        value = value.replace(image_path, str(root / image_path.lstrip("/")))
    return value


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    root = tmp_path_factory.mktemp("image")
    _, (build, final) = stages()
    workdir = Path(_image_path(root, build.last("WORKDIR").value))
    workdir.mkdir(parents=True)
    for sources, destination, options in build.copies():
        assert not options, f"unexpected COPY options in the build stage: {options}"
        target = workdir / destination
        for source in sources:
            origin = ROOT / source
            assert origin.exists(), f"the Dockerfile copies {source}, which does not exist"
            if origin.is_dir():
                shutil.copytree(origin, target if source.endswith("/") else target / origin.name,
                                dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                destination_file = target / origin.name if destination.endswith("/") else target
                destination_file.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, destination_file)
    env = dict(os.environ)
    env.update(build.env())
    # The one difference from the image: reuse pip's cache, for speed.
    env.pop("PIP_NO_CACHE_DIR", None)
    env.pop("VIRTUAL_ENV", None)
    # `python` and `python3` as in the base image: this interpreter.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    runs = build.all("RUN")
    assert runs, "the build stage runs nothing"
    for item in runs:
        command = _image_path(root, item.value)
        result = subprocess.run(["sh", "-c", command], cwd=workdir, env=env,
                                capture_output=True, text=True, timeout=540)
        assert result.returncode == 0, (
            f"RUN {item.value}\nfailed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    # The final stage ships the virtualenv and nothing else from the build.
    shipped = [(sources, destination) for sources, destination, options in final.copies()
               if options.get("from") == build.name]
    assert shipped == [(["/opt/arbiter"], "/opt/arbiter")]
    wheels = list((root / "dist").glob("kube_arbiter-*.whl"))
    assert len(wheels) == 1, wheels
    yield Built(root, root / "opt" / "arbiter", wheels[0])


def test_wheel_holds_only_the_runtime_packages(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as wheel:
        names = wheel.namelist()
    top = {name.split("/", 1)[0] for name in names}
    assert {"arbiter", "webhook", "extender", "certs"} <= top
    assert not {"tests", "bench", "sandbox", "manifests"} & top
    assert "arbiter/py.typed" in names
    assert not [name for name in names if name.startswith("arbiter/testing/")]


def test_virtualenv_has_runtime_dependencies_only(built: Built) -> None:
    listing = built.run(
        "python", "-c",
        "import importlib.metadata as m, json;"
        "print(json.dumps(sorted({d.metadata['Name'].lower().replace('_', '-') "
        "for d in m.distributions()})))")
    assert listing.returncode == 0, listing.stderr
    installed = set(json.loads(listing.stdout))
    assert installed >= RUNTIME
    assert not TEST_ONLY & installed, TEST_ONLY & installed
    # pip and setuptools are removed: nothing installs at run time.
    assert not {"pip", "setuptools"} & installed


def test_code_runs_from_the_virtualenv_not_the_checkout(built: Built) -> None:
    modules = ["arbiter.server.app", "arbiter.server.context", "arbiter.loop.runtime",
               "arbiter.jobflow.controller", "webhook.http", "extender.routes", "certs.manager",
               "arbiter.cli.queues", "arbiter.cli.demo"]
    check = built.run("python", "-c",
                      f"import importlib, arbiter; [importlib.import_module(m) for m in "
                      f"{modules!r}]; print(arbiter.__file__)")
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip().startswith(str(built.venv))


def test_entrypoint_serve_help_documents_the_configuration(built: Built) -> None:
    _, (_, final) = stages()
    entrypoint = final.last("ENTRYPOINT").exec_form()
    assert entrypoint == ["arbiter", "serve"]
    result = built.run(*entrypoint, "--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--port", "--cert-dir", "--excluded-namespaces", "--overcommit",
                 "--reclaim-grace", "--status-interval", "--status-qps", "--lease-name"):
        assert flag in result.stdout


def test_fairshare_runs_offline(built: Built) -> None:
    scenario = built.root / "drf-paper.yaml"
    scenario.write_text(DRF_PAPER)
    result = built.run("arbiter", "fairshare", str(scenario))
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["queues"]["A"]["admitted"] == 3
    assert outcome["queues"]["B"]["admitted"] == 2


def test_healthcheck_command_is_valid_python() -> None:
    _, (_, final) = stages()
    command = json.loads(final.last("HEALTHCHECK").value.split("CMD", 1)[1])
    assert command[:2] == ["python", "-c"]
    compile(command[2], "<healthcheck>", "exec")
    assert "/healthz" in command[2]
