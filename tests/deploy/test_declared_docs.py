"""Declared integrations in the docs and manifests agree with the code:
docs/integrations.md's "Declared integrations" declaration parses and
passes the check against its CRD block, its Widget reads as the documented
unit, its ClusterRole is what `arbiter integrations manifest` prints; and
manifests/declared/ holds the same declaration, `manifest`'s webhooks and
ClusterRole, and mounts the file where ARBITER_INTEGRATION_FILE points."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import yaml

from arbiter.integrations import BY_KIND
from arbiter.integrations.declared import build, parse
from arbiter.integrations.declared_schema import check
from arbiter.server import declared
from arbiter.server.declared import RESERVED_KINDS
from tests.deploy.manifests import MANIFESTS, ROOT, documents, kustomization, yaml_blocks
from tests.integrations.declared_samples import registered

PAGE = ROOT / "docs" / "integrations.md"
SECTION = "\n## Declared integrations\n"
OVERLAY = MANIFESTS / "declared"


def _section_documents() -> list[Any]:
    text = PAGE.read_text().split(SECTION)[1]
    return [doc for block in yaml_blocks(PAGE) if block in text
            for doc in yaml.safe_load_all(block) if doc]


def test_the_documented_declaration_checks_against_the_documented_crd() -> None:
    file, crd, widget, role = _section_documents()
    (decl,) = parse(file, BY_KIND.values(), RESERVED_KINDS)
    assert check(decl, crd) == []
    (integration,) = build([decl])
    (unit,) = integration.units(widget) or ()
    assert {s.name: s.count for s in unit.pod_sets} == {"driver": 1, "workers": 2}
    assert widget["metadata"]["labels"]["arbiter.dev/queue"] == "team-ml"
    with registered(integration):
        assert declared.manifest([integration])[-1] == role
    assert f"{integration.prefix}-{widget['metadata']['name']}" in PAGE.read_text()
    # The file in manifests/declared/ is the documented one.
    assert documents(OVERLAY / "integrations.yaml") == [file]


def test_the_overlay_mounts_the_file_and_adds_manifests_webhooks_and_rbac() -> None:
    overlay = kustomization(OVERLAY)
    assert overlay["resources"] == ["../", "rbac.yaml"]
    (generated,) = overlay["configMapGenerator"]
    assert generated["files"] == ["integrations.yaml"]
    (patch,) = documents(OVERLAY / "deployment-patch.yaml")
    pod = patch["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    path = PurePosixPath(next(e["value"] for e in container["env"]
                              if e["name"] == "ARBITER_INTEGRATION_FILE"))
    (mount,) = container["volumeMounts"]
    assert path.parent == PurePosixPath(mount["mountPath"]) and path.name == "integrations.yaml"
    (volume,) = pod["volumes"]
    assert volume["name"] == mount["name"]
    assert volume["configMap"]["name"] == generated["name"]

    integrations = build(declared.load(OVERLAY / "integrations.yaml"))
    with registered(*integrations):
        *webhooks, role = declared.manifest(integrations)
    assert documents(OVERLAY / "webhooks-patch.yaml") == webhooks
    rbac = documents(OVERLAY / "rbac.yaml")
    assert rbac[0] == role
    binding = rbac[1]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kube-arbiter",
                                    "namespace": "arbiter-system"}]
