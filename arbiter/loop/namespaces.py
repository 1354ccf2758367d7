"""`--managed-namespaces listed`: the leader keeps `arbiter.dev/managed: "true"`
on the namespaces its Queues admit (DESIGN §3).

The webhook configurations select on that label in `listed` mode, so a
namespace no Queue admits (CNI, ingress, cert-manager) is never sent to the
webhook and never depends on arbiter being up. Arbiter adds the label to a
namespace some Queue admits explicitly (`ClusterStore.admitting_queues`:
listed, selected, or named by the namespace's own queue label) and marks it
with an annotation; it removes only a label it marked, once no Queue admits
the namespace. An admin's own `"true"` and an admin's `"false"` (opt out)
are never touched. Namespaces arbiter never manages (the excluded ones)
are never labelled.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import quote

from arbiter.base.aio import wait_event
from arbiter.base.kubeapi import ApiError, ClusterApi, KubeApi, NotFound
from arbiter.cache.store import ClusterStore, Kind
from arbiter.core.api import MANAGED_BY_ARBITER_ANNOTATION, MANAGED_LABEL

log = logging.getLogger(__name__)

# The annotation's value: who set the label (for a reader of the namespace).
MARK = "kube-arbiter"
# Seconds between passes when nothing changed, so a failed patch is retried.
RESYNC = 30.0

Patch = dict[str, Any]


def label_patch(store: ClusterStore, name: str) -> Patch | None:
    """The merge patch that brings namespace `name`'s managed label where the
    Queues say it should be; None when it needs none."""
    record = store.namespaces.get(name)
    if record is None or name in store.excluded_namespaces or not record.managed_label:
        return None  # gone, never arbiter's, or an admin's opt-out
    wanted = bool(store.admitting_queues(name))
    if wanted and not record.opted_in:
        return {"metadata": {"labels": {MANAGED_LABEL: "true"},
                             "annotations": {MANAGED_BY_ARBITER_ANNOTATION: MARK}}}
    if not wanted and record.opted_in and record.marked:
        return {"metadata": {"labels": {MANAGED_LABEL: None},
                             "annotations": {MANAGED_BY_ARBITER_ANNOTATION: None}}}
    return None


def label_patches(store: ClusterStore) -> dict[str, Patch]:
    """namespace -> its patch, for every namespace that needs one."""
    found = ((name, label_patch(store, name)) for name in list(store.namespaces))
    return {name: patch for name, patch in found if patch is not None}


# Namespaces looked at between two yields to the event loop: with many
# Queues with selectors, a pass over thousands of namespaces must not hold
# up the webhook that shares the loop.
SLICE = 20


async def apply_label_patches(api: ClusterApi, store: ClusterStore) -> int:
    """One pass: patch every namespace that needs it; returns how many were
    patched. A failure is logged and left for the next pass."""
    done = 0
    for index, name in enumerate(list(store.namespaces), start=1):
        if index % SLICE == 0:
            await asyncio.sleep(0)
        patch = label_patch(store, name)
        if patch is None:
            continue
        try:
            await api.merge_patch(f"/api/v1/namespaces/{quote(name, safe='')}", patch)
        except NotFound:
            continue
        except ApiError as error:
            log.warning("could not set the managed label of namespace %s: %s", name, error)
            continue
        done += 1
        wanted = patch["metadata"]["labels"][MANAGED_LABEL] is not None
        log.info("namespace %s %s", name,
                 "is admitted by a Queue: labelled managed" if wanted
                 else "is admitted by no Queue any more: managed label removed")
    return done


async def run_leader(*, api: Any | None, store: ClusterStore) -> None:
    """Leader-only, `listed` mode only (one of `arbiter.server.app.leader_tasks`):
    a pass after every Queue or Namespace change, and every RESYNC seconds."""
    if api is None or store.managed_mode != "listed":
        return
    cluster = KubeApi(api)
    changed = asyncio.Event()
    seen = store.access_generation

    def on_change(kind: Kind, _: str) -> None:
        nonlocal seen
        # A Queue event counts only when what it admits changed: status
        # writes (every few seconds) do not.
        if kind == "Namespace" or (kind == "Queue" and store.access_generation != seen):
            seen = store.access_generation
            changed.set()

    store.listeners.append(on_change)
    try:
        while True:
            changed.clear()
            # Before both are listed, "no Queue admits it" would be a guess.
            if {"Queue", "Namespace"} <= store.synced_kinds:
                await apply_label_patches(cluster, store)
            await wait_event(changed, RESYNC)
    finally:
        store.listeners.remove(on_change)
