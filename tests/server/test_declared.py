"""Declared integrations at run time (arbiter/server/declared.py) and the
admin's commands (`arbiter integrations check|manifest`): the file loaded,
each CRD read at startup (a refusal exits serve naming the field; a missing
one waits, reported once), a CRD that appears later checked then (switched
on and watched, or kept off with the reason), and the rules to add."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from arbiter.base.kubeapi import ApiError
from arbiter.cache.store import ClusterStore
from arbiter.cli.main import main
from arbiter.integrations.declared import DeclarationError
from arbiter.server import declared
from tests.integrations.declared_samples import (
    crd,
    declaration,
    file_of,
    registered,
    widget_integration,
)
from webhook.endpoints import DECLARED


def _write(path: Path, doc: Any) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def test_load_reads_yaml_or_json_and_refuses_naming_the_field(tmp_path: Path) -> None:
    (decl,) = declared.load(_write(tmp_path / "ok.yaml", file_of()))
    assert decl.kind == "Widget"
    as_json = tmp_path / "ok.json"
    as_json.write_text('{"integrations": [{"group": "example.com"}]}')
    with pytest.raises(DeclarationError, match=r"^integrations\[0\]\.version: is required"):
        declared.load(as_json)
    broken = tmp_path / "broken.yaml"
    broken.write_text("integrations: [\n")
    with pytest.raises(DeclarationError, match=r"broken\.yaml: while parsing"):
        declared.load(broken)
    with pytest.raises(DeclarationError, match=r"missing\.yaml: No such file"):
        declared.load(tmp_path / "missing.yaml")


class _Crds:
    """read_crd's stand-in: the CRDs installed, by name."""

    def __init__(self, **installed: Any) -> None:
        self.installed = installed

    async def __call__(self, api: Any, integration: Any) -> Any:
        return self.installed.get(integration.name.split(".")[0])


async def test_at_startup_a_crd_is_checked_or_its_kind_waits(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    widget = widget_integration()
    store = ClusterStore()
    monkeypatch.setattr(declared, "read_crd", _Crds(widgets=crd()))
    assert await declared.check_installed(object(), [widget], store) == ()
    monkeypatch.setattr(declared, "read_crd", _Crds(widgets=crd(suspend={"type": "string"})))
    with pytest.raises(DeclarationError, match=r"integrations\[0\]\.suspendPath: spec.suspend "
                                               "is string"):
        await declared.check_installed(object(), [widget], store)
    monkeypatch.setattr(declared, "read_crd", _Crds())
    assert await declared.check_installed(object(), [widget], store) == (widget,)
    assert store.declared_off == {"Widget": "CRD widgets.example.com not installed"}
    assert "CRD widgets.example.com not installed" in caplog.text

    async def forbidden(api: Any, integration: Any) -> Any:
        raise ApiError(403, "Forbidden")

    # No RBAC to read it (or the apiserver away): it waits too, said why.
    monkeypatch.setattr(declared, "read_crd", forbidden)
    assert await declared.check_installed(object(), [widget], store) == (widget,)
    assert store.declared_off == {
        "Widget": "CRD widgets.example.com not readable (403: Forbidden)"}


async def test_a_crd_that_appears_later_switches_its_kind_on_or_keeps_it_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    good = widget_integration()
    bad = widget_integration(kind="Gadget", resource="gadgets", prefix="gadget")
    crds = _Crds()
    watched: list[str] = []

    async def watch(api: Any, store: Any, resources: Any) -> None:
        watched.extend(r.kind for r in resources)
        await asyncio.sleep(0.05)
        assert good not in store.integrations  # not before its first list
        store.synced_kinds.update(r.kind for r in resources)

    monkeypatch.setattr(declared, "read_crd", crds)
    monkeypatch.setattr(declared, "run_watchers", watch)
    monkeypatch.setattr(declared, "CRD_POLL", 0.01)
    store = ClusterStore()
    store.declared_off.update({"Widget": "CRD missing", "Gadget": "CRD missing"})
    with registered(good, bad):
        task = asyncio.create_task(declared.run_waiting(object(), store))
        await asyncio.sleep(0.05)
        assert good not in store.integrations and not task.done()
        gadget = crd(suspend={"type": "string"})
        gadget["spec"]["names"] = {"kind": "Gadget", "plural": "gadgets"}
        crds.installed.update(widgets=crd(), gadgets=gadget)
        await asyncio.wait_for(task, 5)  # both seen: nothing left to wait for
    assert store.integrations == (good,)
    assert watched == ["Widget"]
    assert store.declared_off == {"Gadget": "refused: integrations[0].suspendPath: spec.suspend "
                                            "is string in the CRD's schema, not boolean"}
    assert "Gadget" not in [i.kind for i in store.integrations]


def test_check_names_the_field_and_manifest_prints_the_rules(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crd_file = _write(tmp_path / "crd.yaml", crd())
    good = _write(tmp_path / "good.yaml", file_of())
    assert main(["integrations", "check", "--file", str(good), "--crd", str(crd_file)]) == 0
    assert capsys.readouterr().out == "Widget (widgets.example.com/v1): ok\n"
    assert main(["integrations", "check", "--file", str(good)]) == 0
    assert "no CRD given, not checked" in capsys.readouterr().out
    wrong = _write(tmp_path / "wrong.yaml", file_of(declaration(podSets=[
        {"name": "driver", "countPath": "spec.driver.count",
         "templatePath": "spec.driver.template"}])))
    assert main(["integrations", "check", "--file", str(wrong), "--crd", str(crd_file)]) == 1
    assert capsys.readouterr().err == (
        f"{wrong}: integrations[0].podSets[0].countPath: spec.driver.count does not resolve: "
        "spec.driver has no field 'count'\n")

    assert main(["integrations", "manifest", "--file", str(good)]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in documents] == ["MutatingWebhookConfiguration",
                                              "ValidatingWebhookConfiguration", "ClusterRole"]
    assert [w["name"] for d in documents[:2] for w in d["webhooks"]] == [
        "widgets.example.com.mutate.arbiter.dev", "widgets.example.com.validate.arbiter.dev"]
    assert {"apiGroups": ["example.com"], "resources": ["widgets"],
            "verbs": ["get", "list", "watch", "patch"]} in documents[2]["rules"]
    assert {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
            "verbs": ["get"]} in documents[2]["rules"]
    assert DECLARED == []  # manifest registers the kinds for its own run only
