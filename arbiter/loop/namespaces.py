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
import contextlib
import logging
from typing import Any
from urllib.parse import quote

from arbiter.api import MANAGED_BY_ARBITER_ANNOTATION, MANAGED_LABEL
from arbiter.cache.store import ClusterStore, Kind
from arbiter.kubeapi import ApiError, ClusterApi, KubeApi, NotFound

log = logging.getLogger(__name__)

# The annotation's value: who set the label (for a reader of the namespace).
MARK = "kube-arbiter"
# Seconds between passes when nothing changed, so a failed patch is retried.
RESYNC = 30.0

Patch = dict[str, Any]


def label_patches(store: ClusterStore) -> dict[str, Patch]:
    """namespace -> the merge patch that brings its managed label where the
    Queues say it should be; only namespaces that need one."""
    patches: dict[str, Patch] = {}
    for name, record in store.namespaces.items():
        if name in store.excluded_namespaces or not record.managed_label:
            continue  # never arbiter's, or an admin's opt-out
        wanted = bool(store.admitting_queues(name))
        if wanted and not record.opted_in:
            patches[name] = {"metadata": {
                "labels": {MANAGED_LABEL: "true"},
                "annotations": {MANAGED_BY_ARBITER_ANNOTATION: MARK}}}
        elif not wanted and record.opted_in and record.marked:
            patches[name] = {"metadata": {
                "labels": {MANAGED_LABEL: None},
                "annotations": {MANAGED_BY_ARBITER_ANNOTATION: None}}}
    return patches


async def apply_label_patches(api: ClusterApi, store: ClusterStore) -> int:
    """One pass: patch every namespace that needs it; returns how many were
    patched. A failure is logged and left for the next pass."""
    done = 0
    for name, patch in label_patches(store).items():
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
    """Leader-only, `listed` mode only (one of `arbiter.app.leader_tasks`):
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), RESYNC)
    finally:
        store.listeners.remove(on_change)
