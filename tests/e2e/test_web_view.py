"""The web view in a real headless Chromium against the sandbox (issue 31):
three tenants on the queues page, a new Job's waiting count live on the
open page, the waiting unit's reason, a tenant's token sees its queue
only, anonymous gets 401. Screenshots go to $ARBITER_E2E_ARTIFACTS (else
the test's temporary directory)."""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter.sandbox import Sandbox
from tests.e2e.browser import Browser
from tests.e2e.helpers import (
    arbiter_with,
    create,
    create_tenant,
    delete_tenants,
    get,
    job,
    unique_name,
    wait_for,
)

READ_UNITS = {"apiGroups": ["arbiter.dev"], "resources": ["queueunits"], "verbs": ["list"]}
# The admin reads the debug API too (to compare reasons).
GET_QUEUES = {"apiGroups": ["arbiter.dev"], "resources": ["queues"], "verbs": ["get"]}


@pytest.fixture
def browser() -> Iterator[Browser]:
    instance = Browser()
    try:
        yield instance
    finally:
        instance.quit()


def _artifacts(tmp_path: Path) -> Path:
    return Path(os.environ.get("ARBITER_E2E_ARTIFACTS", tmp_path)) / "web-view"


def _viewer(sandbox: Sandbox, namespace: str, name: str, *, everywhere: bool) -> str:
    """A ServiceAccount that may list QueueUnits in `namespace` (or in all
    namespaces), and a token for it."""
    binding = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    role_kind = "ClusterRole" if everywhere else "Role"
    meta = {"name": name} if everywhere else {"name": name, "namespace": namespace}
    create(sandbox,
           {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace}},
           {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": role_kind,
            "metadata": meta, "rules": [READ_UNITS, GET_QUEUES] if everywhere else [READ_UNITS]},
           {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": f"{role_kind}Binding",
            "metadata": meta, "subjects": [binding],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                        "name": name}})
    return str(sandbox.kubectl("create", "token", name, "-n", namespace).stdout.strip())


def _get(url: str, sandbox: Sandbox, token: str = "") -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(sandbox.arbiter_cert_dir / "ca.crt"))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


WAITING = ("return [...document.querySelectorAll('table.units')[0].tBodies[0].rows]"
           ".map(r => [...r.cells].map(c => c.textContent));")
FACT = ("const c = document.querySelector(`table.facts td.${arguments[0]}`);"
        " return c ? c.textContent : null;")
SPARK = "return !!document.querySelector(`[data-q=\"${arguments[0]}\"] svg.spark polyline`);"
CELL = ("const c = document.querySelector(`[data-q=\"${arguments[0]}\"] "
        "[data-k=\"${arguments[1]}\"]`); return c ? c.textContent : null;")


def test_the_web_view_in_a_browser(sandbox: Sandbox, browser: Browser, tmp_path: Path) -> None:
    artifacts = _artifacts(tmp_path)
    tenants = [(unique_name(f"web-{name}"), unique_name(f"q-{name}"))
               for name in ("alpha", "beta", "gamma")]
    for namespace, queue in tenants:
        create_tenant(sandbox, namespace, queue, capability={"cpu": "1"})
    (alpha, q_alpha), (_beta, q_beta), _ = tenants
    admin_name = unique_name("web-admin")
    try:
        admin = _viewer(sandbox, "arbiter-system", admin_name, everywhere=True)
        tenant = _viewer(sandbox, alpha, "viewer", everywhere=False)
        with arbiter_with(sandbox, ["--web-view", "token", "--debug-api", "token"]):
            root = sandbox.arbiter_metrics_url() + "/view/"
            # Anonymous: 401; a tenant's token: its own queue only.
            assert _get(root, sandbox)[0] == 401
            status, page = _get(root, sandbox, tenant)
            assert status == 200, page[:300]
            assert f'data-q="{q_alpha}"' in page and f'data-q="{q_beta}"' not in page
            assert _get(f"{root}queues/{q_beta}", sandbox, tenant)[0] == 404

            # The browser signs in on the form the view answers without a token.
            browser.open(root)
            assert browser.run("return !!document.getElementById('login');")
            browser.screenshot(artifacts / "sign-in.png")
            browser.run("const f = document.getElementById('login');"
                        "f.elements.token.value = arguments[0]; f.requestSubmit();", admin)
            wait_for("the queues page", lambda: browser.run(
                "return document.querySelectorAll('tr[data-q]').length;"), timeout=10)
            for _, queue in tenants:
                assert browser.run(CELL, queue, "waiting") == "0", queue
            wait_for("the live stream", lambda: browser.run(
                "return document.getElementById('live').classList.contains('on');"),
                timeout=10)
            browser.run("window.notReloaded = true;")

            # One Job fills alpha's capability; the next waits: both seen live.
            create(sandbox, job("first", alpha, runs_for="600s"))
            wait_for("first admitted on the page",
                     lambda: browser.run(CELL, q_alpha, "admitted") == "1", timeout=15)
            created = time.monotonic()
            create(sandbox, job("second", alpha, runs_for="600s"))
            wait_for("second waiting on the page",
                     lambda: browser.run(CELL, q_alpha, "waiting") == "1", timeout=5, poll=0.05)
            took = time.monotonic() - created
            assert browser.run("return window.notReloaded === true;")
            browser.screenshot(artifacts / "queues.png")
            assert took < 2.0, f"the waiting count changed {took:.2f}s after the Job was created"

            # The waiting unit's reason on its queue's page, and its QueueUnit's message.
            browser.open(f"{root}queues/{q_alpha}")
            rows = browser.run(WAITING)
            assert len(rows) == 1, rows
            _, unit, _, _, why, _ = rows[0]
            assert unit.startswith(f"{alpha}/") and why, rows
            name = unit.split("/", 1)[1]
            # The reason is the debug API's, word for word.
            status, body = _get(f"{sandbox.arbiter_metrics_url()}/debug/queues/{q_alpha}/pending",
                                sandbox, admin)
            assert status == 200, body[:300]
            assert [entry["reason"] for entry in json.loads(body)["pending"]] == [why]
            # The loop writes the same reason as the waiting unit's message.
            said = f"waiting in queue {q_alpha}: {why}"
            wait_for("the unit's message", lambda: (get(sandbox, "queueunit", name, "-n", alpha)
                                                    .get("status") or {}).get("message") == said,
                     timeout=10)
            browser.open(f"{root}queues/{q_alpha}")
            assert browser.run(WAITING)[0][5] == said
            browser.screenshot(artifacts / "queue.png")

            # The waiting unit's page says the same; the admitted one's shows
            # its timeline and its plan.
            browser.run("document.querySelector('table.units a').click();")
            wait_for("the unit page", lambda: browser.run(FACT, "message"), timeout=10)
            assert (browser.run(FACT, "message"), browser.run(FACT, "why-it-waits")) == (said, why)
            browser.open(f"{root}queues/{q_alpha}")
            browser.run("document.querySelectorAll('table.units')[1].querySelector('a').click();")
            wait_for("the admitted unit's page", lambda: browser.run(FACT, "phase"), timeout=10)
            whats = browser.run("return [...document.querySelectorAll('.timeline .what')]"
                                ".map(c => c.textContent);")
            # Admitted at creation, its quota was taken by the Job's webhook
            # call, in the second of the unit's creation or the one before
            # (both times are whole seconds): the three come first, in either order.
            assert sorted(whats[:3]) == ["admitted", "created", "quota taken"], whats
            # The admission as the QueueUnit's status has it (read from the apiserver).
            assert browser.run("return document.querySelector('.timeline').textContent;") \
                .count(f"attempt 1 · queue {q_alpha}") == 1
            plan = browser.run("return document.querySelector('p.plan').textContent;")
            assert plan.startswith("pool "), plan
            browser.screenshot(artifacts / "unit.png")

            # Pools and nodes: a row per pool, a square per node.
            browser.open(f"{root}pools")
            assert browser.run("return document.querySelectorAll('tr[data-pool]').length;") >= 1
            assert browser.run("return document.querySelectorAll('.grid .node').length;") >= 1
            browser.screenshot(artifacts / "pools.png")
            # Decisions: alpha's first Job admitted, newest first.
            browser.open(f"{root}decisions?queue={q_alpha}")
            decided = browser.run(
                "return [...document.querySelectorAll('table.decisions tbody tr')]"
                ".map(r => r.cells[1].textContent);")
            assert decided == ["admit"], decided
            browser.screenshot(artifacts / "decisions.png")
            # The queues page again, bars filled in, and (within one sample,
            # 10 s) the share history drawn (README's picture).
            def sampled() -> bool:
                browser.open(root)
                return bool(browser.run(SPARK, q_alpha))

            wait_for("a share sample", sampled, timeout=15, poll=1.0)
            wait_for("the live stream", lambda: browser.run(
                "return document.getElementById('live').classList.contains('on');"),
                timeout=10)
            # The window cut to the page (the README's picture stays small).
            browser.resize(1280, 16 + browser.run(
                "return document.body.scrollHeight + window.outerHeight - window.innerHeight;"))
            browser.screenshot(artifacts / "queues-later.png")
    finally:
        delete_tenants(sandbox, [namespace for namespace, _ in tenants],
                       [queue for _, queue in tenants])
        sandbox.kubectl("delete", "serviceaccount,clusterrole,clusterrolebinding", admin_name,
                        "-n", "arbiter-system", "--ignore-not-found", check=False)
    print(json.dumps({"screenshots": str(artifacts), "waiting_seen_after_s": round(took, 2)}))
