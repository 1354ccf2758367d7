"""The examples of docs/integrations.md are what arbiter queues: each
block parses, each workload is of an integrated kind and version, names the
documented tenant's queue, lives in a namespace that queue admits, and has
a complete spec (its integration reads units from it). The e2e test
tests/e2e/test_integration_deployment.py applies them on a sandbox."""

from __future__ import annotations

import yaml

from arbiter.core.api import QUEUE_LABEL
from arbiter.integrations import BY_KIND, OPTIONAL
from tests.deploy.manifests import ROOT, Obj, yaml_blocks

PAGE = ROOT / "docs" / "integrations.md"
DECLARED_SECTION = "## Declared integrations"


def _examples() -> list[Obj]:
    # The built-in kinds' (the declared section's are test_declared_docs.py's).
    return [doc for block in yaml_blocks(PAGE, until=DECLARED_SECTION)
            for doc in yaml.safe_load_all(block) if doc]


def test_every_integration_has_a_section_and_an_example() -> None:
    examples = _examples()
    kinds = [doc["kind"] for doc in examples]
    assert sorted(kinds) == sorted(["Namespace", "Queue",
                                    *(integration.kind for integration in OPTIONAL)])
    text = PAGE.read_text()
    for integration in OPTIONAL:
        assert f"\n## {integration.kind}\n" in text, integration.kind
        assert f"`{integration.name}`" in text  # its --integrations word


def test_each_example_is_queued_in_the_documented_queue() -> None:
    examples = _examples()
    queues = {doc["metadata"]["name"]: doc["spec"] for doc in examples if doc["kind"] == "Queue"}
    namespaces = {doc["metadata"]["name"] for doc in examples if doc["kind"] == "Namespace"}
    workloads = [doc for doc in examples if doc["kind"] in BY_KIND]
    assert len(workloads) == len(OPTIONAL)
    for doc in workloads:
        integration = BY_KIND[doc["kind"]]
        assert doc["apiVersion"] == integration.api_version, doc["kind"]
        queue = doc["metadata"]["labels"][QUEUE_LABEL]
        assert doc["metadata"]["namespace"] in queues[queue]["namespaces"]
        assert doc["metadata"]["namespace"] in namespaces
        if integration.units_from:
            assert doc["spec"]["runtimeRef"]["name"], doc["kind"]
            continue  # its pods are in the child its controller makes (e2e runs it)
        units = integration.units(doc)
        assert units is not None, f"{doc['kind']}: the spec is not complete"
        if not integration.per_pod:
            assert units and all(unit.pod_sets for unit in units), doc["kind"]


def test_the_jobset_example_is_the_documented_size() -> None:
    jobset = next(doc for doc in _examples() if doc["kind"] == "JobSet")
    (unit,) = BY_KIND["JobSet"].units(jobset) or ()
    assert {s.name: s.count for s in unit.pod_sets} == {"driver": 1, "workers": 2}
    assert "shows its one unit (1.5 CPU)" in PAGE.read_text()
