"""Declared integrations at run time (`arbiter serve --integration-file`;
the declarations: arbiter.integrations.declared).

    load(path)                 the file, parsed strictly (startup: a refusal exits)
    register(integrations)     the kinds join the registries of every layer
    check_installed(api, ...)  each kind's CRD read once at startup: checked now
                               (a refusal exits), or waited for when missing
                               or unreadable (no RBAC to get it, the apiserver away)
    wait_for_crds(...)         a background task: a missing CRD is read again
                               every CRD_POLL seconds; once there it is checked,
                               then the kind is switched on and watched (or, refused,
                               stays off: logged once, in store.declared_off)
    manifest(integrations)     the webhook and RBAC rules an admin adds for them

No request path reads a CRD: only startup and the background task do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import orjson
import yaml

from arbiter.base.kubeapi import ApiError, request_json
from arbiter.cache import declared as cache_declared
from arbiter.cache.store import DEFAULT_EXCLUDED_NAMESPACES, KINDS, ClusterStore, Kind
from arbiter.cache.watch import Resource, run_watchers
from arbiter.integrations import BY_KIND, declare
from arbiter.integrations.declared import (
    Declaration,
    DeclarationError,
    DeclaredIntegration,
    parse,
)
from arbiter.integrations.declared_schema import check
from webhook import declared as webhook_declared
from webhook.endpoints import DECLARED

log = logging.getLogger(__name__)

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CRD_POLL = 10.0
# Kinds arbiter's cache files besides the integrations': a declared kind may
# not take their names.
RESERVED_KINDS: tuple[str, ...] = (*KINDS, "JobFlow", "JobTemplate", "PodGroup")


def read_document(path: Path) -> Any:
    """A YAML or JSON file (JSON is YAML); one document."""
    try:
        text = path.read_text()
    except OSError as error:
        raise DeclarationError(str(path), error.strerror or str(error)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise DeclarationError(str(path), " ".join(str(error).split())) from None


def load(path: Path) -> tuple[Declaration, ...]:
    """The declarations in `path`; raises DeclarationError naming the field."""
    return parse(read_document(path), BY_KIND.values(), RESERVED_KINDS)


def register(integrations: Iterable[DeclaredIntegration], *, on: bool = True) -> None:
    """Every layer's registry gains (or, `on=False`, loses) these kinds."""
    items = tuple(integrations)
    declare(items, on=on)
    cache_declared.register(items, on=on)
    webhook_declared.register(items, on=on)


async def read_crd(api: Any, integration: DeclaredIntegration) -> Any | None:
    """The kind's CRD, or None when it is not installed."""
    try:
        return await request_json(api, "GET", f"{CRD_PATH}/{integration.name}")
    except ApiError as error:
        if error.status == 404:
            return None
        raise


def _checked(integration: DeclaredIntegration, crd: Any) -> None:
    """Raises DeclarationError; logs what could not be checked."""
    for note in check(integration.decl, crd):
        log.warning("declared integration: %s", note, extra={"kind": integration.kind})


async def check_installed(api: Any, integrations: Sequence[DeclaredIntegration],
                          store: ClusterStore) -> tuple[DeclaredIntegration, ...]:
    """At startup: each kind whose CRD is installed is checked (raises
    DeclarationError on the first refused); the rest are returned, to wait
    for (each reported once, and off until then)."""
    missing: list[DeclaredIntegration] = []
    for integration in integrations:
        try:
            crd = await read_crd(api, integration)
        except ApiError as error:  # forbidden, the apiserver away: read again later
            why = f"CRD {integration.name} not readable ({error.status}: {error.reason})"
        else:
            if crd is not None:
                _checked(integration, crd)
                continue
            why = f"CRD {integration.name} not installed"
        log.warning("declared integration %s: %s; its kind waits for it", integration.kind, why)
        store.declared_off[integration.kind] = why
        missing.append(integration)
    return tuple(missing)


async def wait_for_crds(api: Any, store: ClusterStore,
                        missing: Sequence[DeclaredIntegration], *,
                        poll: float = CRD_POLL) -> None:
    """Read each missing CRD every `poll` seconds; once installed, check it:
    switch the kind on and watch it, or keep it off with the reason."""
    waiting = list(missing)
    watches: list[asyncio.Task[None]] = []
    try:
        while waiting:
            await asyncio.sleep(poll)
            for integration in list(waiting):
                try:
                    crd = await read_crd(api, integration)
                except ApiError as error:
                    log.debug("reading a CRD failed: %s", error)
                    continue
                if crd is None:
                    continue
                waiting.remove(integration)
                try:
                    _checked(integration, crd)
                except DeclarationError as error:
                    log.error("declared integration %s refused: %s (the kind stays off)",
                              integration.kind, error)
                    store.declared_off[integration.kind] = f"refused: {error}"
                    continue
                resource = Resource(cast(Kind, integration.kind), integration.collection_path())
                watches.append(asyncio.create_task(run_watchers(api, store, (resource,)),
                                                   name=f"watch-{integration.kind}"))
                watches.append(asyncio.create_task(_switch_on(store, integration),
                                                   name=f"switch-on-{integration.kind}"))
        if watches:
            await asyncio.gather(*watches)
    finally:
        for task in watches:
            task.cancel()


async def _switch_on(store: ClusterStore, integration: DeclaredIntegration) -> None:
    """Switch the kind on once its watch has listed it: before, the cache
    would count as not synced (the extender and readiness would wait)."""
    while integration.kind not in store.synced_kinds:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    store.declared_off.pop(integration.kind, None)
    store.integrations = (*store.integrations, integration)
    log.info("declared integration %s: CRD installed and checked; switched on",
             integration.kind)


async def run_waiting(api: Any, store: ClusterStore) -> None:
    """`wait_for_crds` for the declared kinds still waiting for their CRD
    (again after a restart of the task: the refused ones are not)."""
    missing = [integration for kind, why in store.declared_off.items()
               if isinstance(integration := BY_KIND.get(kind), DeclaredIntegration)
               and not why.startswith("refused")]
    if api is not None and missing:
        await wait_for_crds(api, store, missing, poll=CRD_POLL)


ROLE_NAME = "kube-arbiter-declared"


def manifest(integrations: Sequence[DeclaredIntegration]) -> list[dict[str, Any]]:
    """What an admin adds for the declared kinds (they must be registered):
    their webhooks, as strategic-merge patches of arbiter's two webhook
    configurations (`webhooks` merge by name), and a ClusterRole with their
    rules (manifests/declared/ holds both for its example)."""
    from webhook.configuration import (
        CONFIGURATION_NAME,
        desired_configurations,
        service_account_username,
    )

    kinds = {i.kind for i in integrations}
    mutating, validating = desired_configurations(
        service=("arbiter-system", "kube-arbiter"), excluded_namespaces=DEFAULT_EXCLUDED_NAMESPACES,
        own_usernames=(service_account_username("arbiter-system", "kube-arbiter"),))
    paths = {e.path for e in DECLARED if e.kind in kinds}
    webhooks = [{"apiVersion": configuration["apiVersion"], "kind": configuration["kind"],
                 "metadata": {"name": CONFIGURATION_NAME},
                 "webhooks": [w for w in configuration["webhooks"]
                              if w["clientConfig"]["service"]["path"] in paths]}
                for configuration in (mutating, validating)]
    # Reading each declared kind's CRD (startup, and while one is missing).
    rules: list[dict[str, Any]] = [
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "verbs": ["get"]}]
    for integration in integrations:
        # The cache (list, watch); suspend and placement (get, patch); a
        # unit names its workload as owner with blockOwnerDeletion (finalizers).
        rules.append({"apiGroups": [integration.group], "resources": [integration.resource],
                      "verbs": ["get", "list", "watch", "patch"]})
        rules.append({"apiGroups": [integration.group],
                      "resources": [f"{integration.resource}/finalizers"], "verbs": ["update"]})
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": ROLE_NAME}, "rules": rules}
    return [*webhooks, role]


def dumps(documents: Iterable[Any]) -> str:
    """YAML documents, keys in order (orjson round trip: plain types only)."""
    plain = [orjson.loads(orjson.dumps(doc)) for doc in documents]
    return "---\n".join(yaml.safe_dump(doc, sort_keys=False) for doc in plain)
