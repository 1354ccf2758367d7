"""A custom resource queued by declaration (issue 29, DESIGN §14): a CRD the
test defines (`Widget`: a driver and workers, counts at different paths)
and a tiny controller the test runs (it makes pods from the templates while
a Widget is unsuspended and deletes them when it is suspended), with
arbiter told of the kind only by `--integration-file`. The Widget is held,
admitted whole, placed into its pool and reclaimed; a tenant cannot get
round the queue; a declaration with a wrong path is refused naming it.
On the `integrated` sandbox (8 fake nodes x 1 CPU).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    arbiter_get,
    arbiter_with,
    create,
    create_namespace,
    get,
    run_arbiter,
    tenant,
    unique_name,
    wait_for,
)
from tests.e2e.workloads import (
    NODES,
    allocated_cpu,
    consumer,
    consumer_ref,
    container,
    job_of,
    phase,
    pod_sets,
    pods,
    pool,
    quiet,
    running,
    set_room,
    suspended,
    unit,
)

GROUP, KIND, PLURAL = "e2e.arbiter.dev", "Widget", "widgets"
POOL_NODES = NODES[-4:]
SETS = {"driver": ("driver", "replicas"), "workers": ("workers", "count")}


def _open(**extra: Any) -> dict[str, Any]:
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True, **extra}


def _template() -> dict[str, Any]:
    return {"type": "object", "properties": {
        "metadata": _open(),
        "spec": _open(properties={"containers": {"type": "array", "items": _open()}})}}


def crd(kind: str = KIND, plural: str = PLURAL, count_type: str = "integer") -> dict[str, Any]:
    """Suspend at spec.suspend, the driver's count at spec.driver.replicas,
    the workers' at spec.workers.count (`count_type`: to make it wrong)."""
    def pod_set(count: str) -> dict[str, Any]:
        return {"type": "object", "properties": {count: {"type": count_type},
                                                 "template": _template()}}
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "suspend": {"type": "boolean"},
            "driver": pod_set("replicas"), "workers": pod_set("count")}},
        "status": _open()}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{GROUP}"},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": plural[:-1],
                               "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}


def declaration(kind: str = KIND, plural: str = PLURAL,
                workers_count: str = "spec.workers.count") -> dict[str, Any]:
    return {"group": GROUP, "version": "v1", "kind": kind, "resource": plural,
            "suspendPath": "spec.suspend",
            "podSets": [{"name": "driver", "countPath": "spec.driver.replicas",
                         "templatePath": "spec.driver.template"},
                        {"name": "workers", "countPath": workers_count,
                         "templatePath": "spec.workers.template"}],
            "finishedConditions": ["Complete"], "failedConditions": ["Failed"]}


def widget(name: str, ns: str, workers: int, **labels: str) -> dict[str, Any]:
    template = {"spec": {"containers": [container()]}}
    return {"apiVersion": f"{GROUP}/v1", "kind": KIND,
            "metadata": {"name": name, "namespace": ns, **({"labels": labels} if labels else {})},
            "spec": {"driver": {"replicas": 1, "template": template},
                     "workers": {"count": workers, "template": template}}}


# -- the tiny controller ---------------------------------------------------------------------


async def _reconcile(api: Any, ns: str) -> None:
    from kubernetes_asyncio import client

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    widgets = (await custom.list_namespaced_custom_object(GROUP, "v1", ns, PLURAL))["items"]
    live = [p for p in (await core.list_namespaced_pod(ns)).items
            if p.metadata.deletion_timestamp is None]
    for item in widgets:
        meta, spec = item["metadata"], item.get("spec") or {}
        owned = {p.metadata.name for p in live
                 if any(r.uid == meta["uid"] for r in p.metadata.owner_references or ())}
        wanted: dict[str, dict[str, Any]] = {}
        if not spec.get("suspend"):
            for set_name, (field, count) in SETS.items():
                part = spec.get(field) or {}
                for index in range(int(part.get(count) or 0)):
                    wanted[f"{meta['name']}-{set_name}-{index}"] = part.get("template") or {}
        for name in owned - set(wanted):
            await core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        for name in sorted(set(wanted) - owned):
            template = wanted[name]
            pod_meta = {**(template.get("metadata") or {}), "name": name, "ownerReferences": [
                {"apiVersion": f"{GROUP}/v1", "kind": KIND, "name": meta["name"],
                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]}
            try:
                body: Any = {"metadata": pod_meta, "spec": template.get("spec") or {}}
                await core.create_namespaced_pod(ns, body)
            except client.ApiException as error:
                if error.status != 409:
                    raise


@pytest.fixture
def controller(integrated: Sandbox) -> Iterator[list[str]]:
    """Reconciles Widgets in the namespaces appended to the list it yields,
    every 0.3 s, in a thread of its own; stopped afterwards."""
    namespaces: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    async def run() -> None:
        from kubernetes_asyncio import config

        api = await config.new_client_from_config(config_file=str(integrated.kubeconfig),
                                                  persist_config=False)
        async with api:
            while not stop.is_set():
                for ns in list(namespaces):
                    try:
                        await _reconcile(api, ns)
                    except Exception as error:  # a namespace going away, a 404
                        errors.append(error)
                await asyncio.sleep(0.3)

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    try:
        yield namespaces
    finally:
        stop.set()
        thread.join(10)
        for error in errors[-5:]:  # shown when the test failed
            print(f"controller: {error!r}"[:500])


@pytest.fixture(scope="module")
def declared(integrated: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The Widget CRD installed and arbiter restarted with it declared (and
    a short reclaim grace); the file's path."""
    here = tmp_path_factory.mktemp("declared")
    integrated.apply_yaml(json.dumps(crd()))
    integrated.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}",
                       "--timeout=30s")
    path = here / "integrations.yaml"
    # Gadget's CRD comes later (test_a_declaration_with_a_wrong_path_...).
    path.write_text(yaml.safe_dump({"integrations": [
        declaration(), declaration("Gadget", "gadgets")]}))
    with arbiter_with(integrated, ["--integration-file", str(path), "--reclaim-grace", "3"]):
        yield path


def test_a_declared_kind_is_held_admitted_whole_placed_and_reclaimed_whole(
        integrated: Sandbox, declared: Path, controller: list[str]) -> None:
    sb = integrated
    quiet(sb)
    with pool(sb, POOL_NODES) as (pool_name, selector), \
            tenant(sb, "wd", wait=60, capability={"cpu": "2"}, pools=[pool_name]) as (ns, q), \
            tenant(sb, "jobwd", wait=60, guarantee={"cpu": "4"},
                   pools=[pool_name]) as (other_ns, _):
        controller.append(ns)
        create(sb, widget("w", ns, workers=2))
        created = get(sb, PLURAL, "w", "-n", ns)
        assert created["spec"]["suspend"] is True  # held at the door
        template_labels = created["spec"]["workers"]["template"]["metadata"]["labels"]
        assert template_labels["arbiter.dev/queue"] == q
        queued = wait_for("the Widget's unit", lambda: unit(sb, ns, "widget-w"))
        assert consumer_ref(queued) == consumer(created)
        assert pod_sets(queued) == {"driver": 1, "workers": 2}
        time.sleep(3)  # time enough to admit it (wrongly)
        assert phase(unit(sb, ns, "widget-w")) == "Enqueued"
        assert pods(sb, ns) == []  # 3 CPUs do not fit in 2: not one pod
        assert allocated_cpu(sb, q) == "0"

        set_room(sb, ns, q, 3, pools=[pool_name])
        wait_for("its 3 pods Running", lambda: len(running(sb, ns)) == 3, timeout=60)
        for pod in pods(sb, ns):
            assert selector.items() <= (pod["spec"].get("nodeSelector") or {}).items(), pod
            assert pod["spec"]["nodeName"] in POOL_NODES
        assert allocated_cpu(sb, q) == "3"
        # Running once a pod is bound (the declaration names no readyPath).
        wait_for("its unit Running", lambda: phase(unit(sb, ns, "widget-w")) == "Running",
                 timeout=30)

        # Under its guarantee, another queue's 2-CPU Job in the pool (1 CPU
        # free there) takes the Widget back, whole.
        create(sb, job_of("batch", other_ns, 2, runs_for="5s"))
        wait_for("the Widget suspended again", lambda: suspended(sb, ns, PLURAL, "w"), timeout=60)
        wait_for("its pods gone", lambda: pods(sb, ns) == [], timeout=60)
        held = get(sb, PLURAL, "w", "-n", ns)["spec"]["driver"]["template"]["spec"]
        assert "nodeSelector" not in held  # the placement taken off
        assert phase(unit(sb, ns, "widget-w")) == "Enqueued"  # requeued, not Failed
        wait_for("the Widget running again whole", lambda: len(running(sb, ns)) == 3,
                 timeout=90)
        assert not suspended(sb, ns, PLURAL, "w")


def test_a_tenant_cannot_get_round_the_queue_with_a_declared_kind(
        integrated: Sandbox, declared: Path, controller: list[str]) -> None:
    sb = integrated
    loose = unique_name("wd-noq")
    create_namespace(sb, loose)
    try:
        with tenant(sb, "wdh", wait=60, capability={"cpu": "3"}) as (ns, q), \
                tenant(sb, "wdo", wait=60) as (_, other_q):
            controller.append(ns)
            refused = sb.kubectl("create", "-f", "-", check=False,
                                 input=json.dumps(widget("w", loose, workers=1)))
            assert refused.returncode != 0 and "has no queue" in refused.stderr
            stolen = sb.kubectl("create", "-f", "-", check=False, input=json.dumps(
                widget("s", ns, workers=1, **{"arbiter.dev/queue": other_q})))
            assert stolen.returncode != 0 and other_q in stolen.stderr, stolen.stderr

            create(sb, widget("w", ns, workers=4))  # 5 CPUs in a queue of 3
            wait_for("its unit", lambda: unit(sb, ns, "widget-w"))
            started = sb.kubectl("patch", PLURAL, "w", "-n", ns, "--type=merge",
                                 "-p", '{"spec":{"suspend":false}}', check=False)
            assert started.returncode != 0
            assert "only kube-arbiter may set spec.suspend to false" in started.stderr
            assert suspended(sb, ns, PLURAL, "w")

            sb.kubectl("patch", PLURAL, "w", "-n", ns, "--type=merge",
                       "-p", '{"spec":{"workers":{"count":2}}}')
            wait_for("3 pods Running", lambda: len(running(sb, ns)) == 3, timeout=60)
            # Grown after admission: held again and queued at the new size.
            sb.kubectl("patch", PLURAL, "w", "-n", ns, "--type=merge",
                       "-p", '{"spec":{"workers":{"count":5}}}')
            wait_for("the Widget suspended again", lambda: suspended(sb, ns, PLURAL, "w"),
                     timeout=30)
            wait_for("queued at 6", lambda: pod_sets(unit(sb, ns, "widget-w") or {"spec": {
                "podSets": []}}) == {"driver": 1, "workers": 5}, timeout=30)
            wait_for("its pods gone", lambda: pods(sb, ns) == [], timeout=60)
            assert phase(unit(sb, ns, "widget-w")) == "Enqueued"
            wait_for("its CPUs freed", lambda: allocated_cpu(sb, q) == "0", timeout=30)
    finally:
        sb.kubectl("delete", "namespace", loose, "--wait=false", check=False)


def test_a_declaration_with_a_wrong_path_is_refused_naming_it(
        integrated: Sandbox, declared: Path, tmp_path: Path) -> None:
    sb = integrated
    crd_file = tmp_path / "crd.yaml"
    crd_file.write_text(yaml.safe_dump(crd()))
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump({"integrations": [
        declaration(workers_count="spec.workers.replicas")]}))
    checked = run_arbiter("integrations", "check", "--file", str(wrong), "--crd", str(crd_file))
    assert checked.returncode == 1
    assert "integrations[0].podSets[1].countPath: spec.workers.replicas does not resolve" \
        in checked.stderr, checked.stderr
    good = run_arbiter("integrations", "check", "--file", str(declared), "--crd", str(crd_file))
    assert good.returncode == 0 and "Widget (widgets.e2e.arbiter.dev/v1): ok" in good.stdout
    assert "Gadget (gadgets.e2e.arbiter.dev/v1): parsed; no CRD given" in good.stdout

    # serve reads the installed CRD at startup and exits, naming the field.
    served = run_arbiter("serve", "--kubeconfig", str(sb.kubeconfig), "--integration-file",
                         str(wrong), "--no-leader-elect", timeout=60)
    assert served.returncode != 0
    last = served.stderr.strip().splitlines()[-1]
    assert "integrations[0].podSets[1].countPath" in last, served.stderr

    # A kind whose CRD comes later is checked when it appears: refused,
    # it stays off (the debug API says why) and its objects are refused.
    sb.apply_yaml(json.dumps(crd("Gadget", "gadgets", count_type="string")))

    def off() -> str:
        status, body = arbiter_get(sb, "/debug/integrations")
        assert status == 200
        return str(json.loads(body)["declaredOff"].get("Gadget", ""))

    reason: str = wait_for("Gadget refused",
                           lambda: off() if off().startswith("refused") else None, timeout=40)
    assert "integrations[1].podSets[0].countPath: spec.driver.replicas is string" in reason
    with tenant(sb, "wdg") as (ns, _):
        gadget = {**widget("g", ns, workers=1), "kind": "Gadget"}
        gadget["spec"]["driver"]["replicas"] = gadget["spec"]["workers"]["count"] = "1"
        refused = sb.kubectl("create", "-f", "-", check=False, input=json.dumps(gadget))
        assert refused.returncode != 0 and "not switched on" in refused.stderr
    sb.kubectl("delete", "crd", f"gadgets.{GROUP}", "--wait=false", check=False)
