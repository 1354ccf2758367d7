"""Declared integrations (arbiter/integrations/declared.py, declared_schema.py):
the file parsed strictly (each refusal names the field), the declaration
checked against its CRD's schema, and the Integration made from it."""

from __future__ import annotations

from typing import Any

import pytest

from arbiter.core.resources import Resources
from arbiter.integrations import BY_KIND
from arbiter.integrations.base import PodSetSpec, UnitSpec
from arbiter.integrations.declared import DeclarationError, build, parse
from arbiter.integrations.declared_schema import check
from arbiter.server.declared import RESERVED_KINDS
from tests.integrations.declared_samples import (
    crd,
    declaration,
    file_of,
    widget,
    widget_integration,
    with_changes,
)


def _refused(doc: Any) -> str:
    with pytest.raises(DeclarationError) as caught:
        parse(doc, BY_KIND.values(), RESERVED_KINDS)
    return str(caught.value)


def test_a_good_declaration_is_read_whole() -> None:
    (decl,) = parse(file_of(), BY_KIND.values(), RESERVED_KINDS)
    assert (decl.group, decl.version, decl.kind, decl.resource) == \
        ("example.com", "v1", "Widget", "widgets")
    assert decl.suspend == ("spec", "suspend")
    assert [(p.name, p.count, p.template) for p in decl.pod_sets] == [
        ("driver", ("spec", "driver", "replicas"), ("spec", "driver", "template")),
        ("workers", ("spec", "workers", "count"), ("spec", "workers", "template"))]
    assert decl.prefix == "widget"
    assert (decl.finished, decl.failed, decl.ready) == (("Complete",), ("Failed",), None)


@pytest.mark.parametrize(("doc", "message"), [
    ([], "file: must be a mapping"),
    ({"integrations": [], "extra": 1}, "file.extra: unknown field"),
    ({}, "file.integrations: is required"),
    ({"integrations": {}}, "integrations: must be a list"),
    ({"apiVersion": "v1", "integrations": []}, "apiVersion: must be 'arbiter.dev/v1alpha1'"),
    (file_of(declaration(colour="red")), "integrations[0].colour: unknown field"),
    (file_of({k: v for k, v in declaration().items() if k != "suspendPath"}),
     "integrations[0].suspendPath: is required"),
    (file_of(declaration(group="")), "integrations[0].group: must be an API group"),
    (file_of(declaration(group="apps")), "integrations[0].group: must be an API group"),
    (file_of(declaration(version="1")), "integrations[0].version: must be a version"),
    (file_of(declaration(kind="widget")), "integrations[0].kind: must be a kind in CamelCase"),
    (file_of(declaration(resource="Widgets")), "integrations[0].resource: must be the plural"),
    (file_of(declaration(suspendPath="spec..suspend")),
     "integrations[0].suspendPath: 'spec..suspend': '' is not a field name"),
    (file_of(declaration(suspendPath="suspend")),
     "integrations[0].suspendPath: 'suspend' must name a field under spec"),
    (file_of(declaration(suspendPath=["spec", "suspend"])),
     "integrations[0].suspendPath: must be a dotted path"),
    (file_of(declaration(podSets=[])), "integrations[0].podSets: must list 1 to 8 pod sets"),
    (file_of(declaration(podSets=[{"name": f"s{i}", "countPath": f"spec.s{i}.n",
                                   "templatePath": f"spec.s{i}.t"} for i in range(9)])),
     "integrations[0].podSets: must list 1 to 8"),
    (file_of(declaration(podSets=[{"name": "a", "countPath": "spec.groups[*].n",
                                   "templatePath": "spec.t"}])),
     "integrations[0].podSets[0].templatePath: a pod set per list element needs its count "
     "and its template in the same list (spec.groups[*]...)"),
    (file_of(declaration(podSets=[{"name": "a", "countPath": "spec.a[*].b[*].n",
                                   "templatePath": "spec.a[*].t"}])),
     "integrations[0].podSets[0].countPath: 'spec.a[*].b[*].n': 'b[*]' is not a field name "
     "(letters, digits, _ and -; one list as name[*]; no list indexes)"),
    (file_of(declaration(podSets=[{"name": "a", "countPath": "spec.a[0].n",
                                   "templatePath": "spec.a[0].t"}])),
     "integrations[0].podSets[0].countPath: 'spec.a[0].n': 'a[0]' is not a field name"),
    (file_of(declaration(suspendPath="spec.s[*].suspend")),
     "integrations[0].suspendPath: 'spec.s[*].suspend': 's[*]' is not a field name (letters, "
     "digits, _ and -; no list indexes)"),
    (file_of(declaration(podSets=[{"name": "a", "countPath": "spec.groups[*]",
                                   "templatePath": "spec.groups[*]"}])),
     "integrations[0].podSets[0].countPath: 'spec.groups[*]' must name a field under spec"),
    (file_of(declaration(podSets=[{"name": "a", "templatePath": "spec.t"}])),
     "integrations[0].podSets[0].countPath: is required"),
    (file_of(declaration(podSets=[{"name": "a", "countPath": "spec.n",
                                   "templatePath": "spec.t", "min": 1}])),
     "integrations[0].podSets[0].min: unknown field"),
    (file_of(declaration(podSets=[{"name": "A", "countPath": "spec.n",
                                   "templatePath": "spec.t"}])),
     "integrations[0].podSets[0].name: must be a DNS label"),
    (file_of(declaration(podSets=[
        {"name": "a", "countPath": "spec.a.n", "templatePath": "spec.a.t"},
        {"name": "a", "countPath": "spec.b.n", "templatePath": "spec.b.t"}])),
     "integrations[0].podSets[1].name: 'a' names another pod set too"),
    (file_of(declaration(podSets=[
        {"name": "a", "countPath": "spec.a.n", "templatePath": "spec.t"},
        {"name": "b", "countPath": "spec.b.n", "templatePath": "spec.t"}])),
     "integrations[0].podSets[1].templatePath: 'spec.t' is pod set 'a''s template too"),
    (file_of(declaration(finishedConditions="Done")),
     "integrations[0].finishedConditions: must be a list of condition types"),
    (file_of(declaration(readyPath="status.ready[0]")), "integrations[0].readyPath:"),
    (file_of(declaration(prefix="Widget")), "integrations[0].prefix: must be a DNS label"),
    (file_of(declaration(prefix="jobset")), "integrations[0].prefix: 'jobset' is JobSet's"),
    (file_of(declaration(prefix="job")), "integrations[0].prefix: 'job' is Job's"),
    (file_of(declaration(), declaration(kind="Gadget")),
     "integrations[1].resource: widgets.example.com is declared twice"),
    (file_of(declaration(), declaration(resource="gadgets")),
     "integrations[1].kind: Widget is declared twice"),
    (file_of(declaration(), declaration(kind="Gadget", resource="gadgets", prefix="widget")),
     "integrations[1].prefix: 'widget' is Widget's unit prefix already"),
    (file_of(declaration(kind="JobSet", resource="jobsets", prefix="js")),
     "integrations[0].kind: JobSet is already known to arbiter (jobset.x-k8s.io/v1alpha2)"),
    (file_of(declaration(kind="Queue", resource="queues", prefix="q")),
     "integrations[0].kind: Queue is already known to arbiter (arbiter's own)"),
])
def test_a_bad_file_is_refused_naming_the_field(doc: Any, message: str) -> None:
    assert _refused(doc).startswith(message)


# -- the CRD's schema --------------------------------------------------------------------


def _check(decl_changes: dict[str, Any] | None = None, crd_doc: Any = None) -> list[str]:
    (decl,) = parse(file_of(declaration(**(decl_changes or {}))), BY_KIND.values())
    return check(decl, crd() if crd_doc is None else crd_doc)


def _schema_refusal(decl_changes: dict[str, Any] | None = None, crd_doc: Any = None) -> str:
    with pytest.raises(DeclarationError) as caught:
        _check(decl_changes, crd_doc)
    return str(caught.value)


def test_a_declaration_that_matches_its_crd_is_accepted_without_notes() -> None:
    assert _check() == []


def test_each_path_must_resolve_to_its_type_in_the_crd() -> None:
    assert _schema_refusal({"suspendPath": "spec.paused"}) == (
        "integrations[0].suspendPath: spec.paused does not resolve: spec has no field 'paused'")
    assert _schema_refusal(crd_doc=crd(suspend={"type": "string"})) == (
        "integrations[0].suspendPath: spec.suspend is string in the CRD's schema, not boolean")
    assert _schema_refusal(crd_doc=crd(workers={"type": "object", "properties": {
        "count": {"type": "string"}, "template": {"type": "object"}}})).startswith(
        "integrations[0].podSets[1].countPath: spec.workers.count is string in the CRD's "
        "schema, not integer")
    assert _schema_refusal(crd_doc=crd(workers={"type": "object", "properties": {
        "count": {"x-kubernetes-int-or-string": True}}})).startswith(
        "integrations[0].podSets[1].countPath: spec.workers.count is int-or-string")
    assert _schema_refusal(crd_doc=crd(driver={"type": "integer"})) == (
        "integrations[0].podSets[0].countPath: spec.driver.replicas does not resolve: "
        "spec.driver is of type integer, not an object")


def test_a_template_must_be_a_pod_template_or_an_object_left_open() -> None:
    no_containers = {"type": "object", "properties": {"count": {"type": "integer"},
                     "template": {"type": "object", "properties": {"spec": {
                         "type": "object", "properties": {"image": {"type": "string"}}}}}}}
    assert _schema_refusal(crd_doc=crd(workers=no_containers)) == (
        "integrations[0].podSets[1].templatePath: spec.workers.template is not a pod template "
        "in the CRD's schema (spec has no field 'containers')")
    as_string = {"type": "object", "properties": {"count": {"type": "integer"},
                                                  "template": {"type": "string"}}}
    assert "is string in the CRD's schema, not a pod template" in \
        _schema_refusal(crd_doc=crd(workers=as_string))
    embedded = {"type": "object", "properties": {"count": {"type": "integer"}, "template": {
        "type": "object", "x-kubernetes-embedded-resource": True,
        "x-kubernetes-preserve-unknown-fields": True}}}
    (note,) = _check(crd_doc=crd(workers=embedded))
    assert note.startswith("integrations[0].podSets[1].templatePath: spec.workers.template is "
                           "an object the schema does not describe")


def test_a_path_into_an_open_object_is_accepted_with_a_note() -> None:
    notes = _check(crd_doc=crd(workers={"type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True}))
    assert [n.split(":")[0] for n in notes] == ["integrations[0].podSets[1].countPath",
                                                "integrations[0].podSets[1].templatePath"]
    assert "spec.workers.count is inside spec.workers, which the schema leaves open" in notes[0]


def test_the_crd_must_be_the_declared_kind_namespaced_and_serve_the_version() -> None:
    other = crd()
    other["spec"]["names"]["kind"] = "Gadget"
    assert _schema_refusal(crd_doc=other).startswith(
        "integrations[0].kind: the CRD defines Gadget")
    cluster = crd()
    cluster["spec"]["scope"] = "Cluster"
    assert "cluster-scoped" in _schema_refusal(crd_doc=cluster)
    assert _schema_refusal({"version": "v2"}) == (
        "integrations[0].version: the CRD does not serve v2 (served: v1)")
    assert _schema_refusal(crd_doc={"kind": "ConfigMap"}).startswith(
        "integrations[0].kind: the CRD given is not a CustomResourceDefinition")
    assert _check({"readyPath": "status.ready"})[0].startswith("integrations[0].readyPath:")


# -- the Integration made from it -----------------------------------------------------------


def test_the_integration_reads_one_unit_of_its_pod_sets_from_the_declared_paths() -> None:
    integration = widget_integration()
    assert (integration.name, integration.api_version, integration.prefix) == \
        ("widgets.example.com", "example.com/v1", "widget")
    assert integration.collection_path("ns") == "/apis/example.com/v1/namespaces/ns/widgets"
    obj = widget("w", driver=1, workers=3)
    one = Resources.parse({"cpu": "1"})
    assert integration.units(obj) == (UnitSpec("", (
        PodSetSpec("driver", 1, one, ("spec", "driver", "template")),
        PodSetSpec("workers", 3, one, ("spec", "workers", "template")))),)
    assert integration.templates(obj) == (("spec", "driver", "template"),
                                          ("spec", "workers", "template"))
    assert integration.labelled(obj) == integration.templates(obj)
    # A pod set of 0 is left out; both at 0: nothing to admit.
    (unit,) = integration.units(widget("w", workers=0)) or ()
    assert [ps.name for ps in unit.pod_sets] == ["driver"]
    assert integration.units(widget("w", driver=0, workers=0)) == ()


@pytest.mark.parametrize("changes", [
    ("spec", "workers", "count", "3"),
    ("spec", "workers", "count", True),
    ("spec", "workers", "count", -1),
    ("spec", "workers", "template", "x"),
    ("spec", "driver", {"template": {"spec": {"containers": []}}}),  # no count
])
def test_a_spec_it_cannot_count_is_unreadable(changes: tuple[Any, ...]) -> None:
    integration = widget_integration()
    assert integration.units(with_changes(widget("w"), *changes)) is None
    assert integration.readable == (
        "spec.driver.replicas a whole number and spec.driver.template a pod template and "
        "spec.workers.count a whole number and spec.workers.template a pod template "
        "(at most 8 pod sets, named apart)")


def test_suspended_outcome_and_ready_come_from_the_declared_fields() -> None:
    integration = widget_integration(readyPath="status.readyPods")
    assert integration.suspended(widget("w", suspend=True))
    assert not integration.suspended(widget("w", suspend=False))
    assert not integration.suspended(widget("w"))
    assert integration.suspend_ops(False) == [
        {"op": "add", "path": "/spec/suspend", "value": False}]

    def with_status(**status: Any) -> dict[str, Any]:
        return {**widget("w"), "status": status}

    def condition(kind: str) -> dict[str, Any]:
        return with_status(conditions=[{"type": kind, "status": "True"}])

    assert integration.outcome(condition("Complete")) == "Complete"
    assert integration.outcome(condition("Failed")) == "Failed"
    assert integration.outcome(condition("Running")) is None
    assert integration.outcome(with_status(conditions=[
        {"type": "Complete", "status": "True"}, {"type": "Failed", "status": "True"}])) == "Failed"
    assert integration.ready(with_status(readyPods=3)) == 3
    assert not integration.ready_from_pods
    plain = widget_integration()
    assert plain.ready(with_status(readyPods=3)) == 0 and plain.ready_from_pods


def test_build_makes_one_integration_per_declaration() -> None:
    decls = parse(file_of(declaration(), declaration(kind="Gadget", resource="gadgets")),
                  BY_KIND.values())
    assert [i.kind for i in build(decls)] == ["Widget", "Gadget"]
    assert [i.prefix for i in build(decls)] == ["widget", "gadget"]


# -- a pod set per list element (`[*]`) ------------------------------------------------------

GROUPS = {"name": "group", "countPath": "spec.groups[*].replicas",
          "templatePath": "spec.groups[*].template"}


def test_a_list_pod_set_gives_one_pod_set_per_element() -> None:
    integration = widget_integration(podSets=[
        {"name": "driver", "countPath": "spec.driver.replicas",
         "templatePath": "spec.driver.template"}, GROUPS])
    obj = widget("w")
    template = obj["spec"]["driver"]["template"]
    obj["spec"]["groups"] = [{"replicas": 2, "template": template},
                             {"replicas": 3, "template": template}]
    (unit,) = integration.units(obj) or ()
    assert [(p.name, p.count, p.template) for p in unit.pod_sets] == [
        ("driver", 1, ("spec", "driver", "template")),
        ("group-0", 2, ("spec", "groups", 0, "template")),
        ("group-1", 3, ("spec", "groups", 1, "template"))]
    assert integration.templates(obj)[1:] == (("spec", "groups", 0, "template"),
                                              ("spec", "groups", 1, "template"))
    assert "spec.groups[*].replicas a whole number" in integration.readable
    del obj["spec"]["groups"]  # no list: no pod set from it
    assert [p.name for p in (integration.units(obj) or ())[0].pod_sets] == ["driver"]
    obj["spec"]["groups"] = {"replicas": 1}
    assert integration.units(obj) is None  # not a list
    obj["spec"]["groups"] = [{"replicas": 1, "template": template}] * 8
    assert integration.units(obj) is None  # 9 pod sets in all: more than 8
    obj["spec"]["groups"] = [{"replicas": 1, "template": template}] * 100_000
    assert integration.units(obj) is None
    # Read one past the bound, not expanded whole.
    assert len(integration.templates(obj)) == 9


def test_a_list_pod_set_is_checked_through_the_lists_items() -> None:
    group = {"type": "object", "properties": {"replicas": {"type": "integer"},
                                              "template": crd()["spec"]["versions"][0]["schema"][
                                                  "openAPIV3Schema"]["properties"]["spec"][
                                                  "properties"]["driver"]["properties"][
                                                  "template"]}}
    listed = crd(groups={"type": "array", "items": group})
    assert _check({"podSets": [GROUPS]}, listed) == []
    assert _schema_refusal({"podSets": [GROUPS]}, crd(groups=group)) == (
        "integrations[0].podSets[0].countPath: spec.groups[*].replicas does not resolve: "
        "spec.groups is object, not a list")
    assert _check({"podSets": [GROUPS]}, crd(groups={
        "type": "array", "x-kubernetes-preserve-unknown-fields": True}))[0].startswith(
        "integrations[0].podSets[0].countPath: spec.groups[*].replicas is inside spec.groups")
