"""List + watch of every kind the store holds, decoded with orjson.

One `Watcher` per kind: a paginated LIST applied object by object (never
the whole list in memory: at 100,000 pods the raw dicts alone would be
gigabytes), objects that disappeared are dropped, then a WATCH from the
list's resourceVersion with bookmarks. The watch resumes from the last
resourceVersion seen after a timeout or a broken connection (with
exponential backoff and jitter), and relists on 410 Gone. A kind whose
CRD is not installed yet (404) is retried the same way, so arbiter can be
started before its CRDs.

Responses are read raw (`_preload_content=False`) and decoded with orjson;
kubernetes_asyncio's model objects are never built.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import orjson

from arbiter.base import metrics
from arbiter.base.kubeapi import ApiError, open_stream
from arbiter.cache.store import (
    NAMESPACED_KINDS,
    WORKLOAD_KINDS,
    ClusterStore,
    EventType,
    Kind,
    store_key,
)
from arbiter.core.api import API_KINDS
from arbiter.integrations import BY_KIND, held_kinds

log = logging.getLogger(__name__)


# Watch events applied between returns to the event loop.
YIELD_EVERY = 32


@dataclass(frozen=True, slots=True)
class Resource:
    kind: Kind
    # The cluster-wide collection path.
    path: str


RESOURCES: tuple[Resource, ...] = (
    Resource("Namespace", "/api/v1/namespaces"),
    Resource("Node", "/api/v1/nodes"),
    Resource("Pod", "/api/v1/pods"),
    Resource("Job", "/apis/batch/v1/jobs"),
    Resource("PriorityClass", "/apis/scheduling.k8s.io/v1/priorityclasses"),
    Resource("RuntimeClass", "/apis/node.k8s.io/v1/runtimeclasses"),
    *(Resource(kind.kind, kind.path) for kind in API_KINDS),
)
_EVENT_TYPES: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED"})


def workload_resources(store: ClusterStore) -> tuple[Resource, ...]:
    """The kinds of the integrations switched on (`store.integrations`), and
    the kinds on their children's controller chains (an LWS's StatefulSets:
    watched for the owner walk even when StatefulSets are not queued)."""
    kinds = set(held_kinds(store.integrations))
    kinds |= {child for i in store.integrations for child in i.children
              if child in WORKLOAD_KINDS}
    return tuple(Resource(cast(Kind, i.kind), i.collection_path())
                 for i in BY_KIND.values() if i.kind in kinds)


class Gone(Exception):
    """410: the resourceVersion is too old; list again."""


def _stub(kind: Kind, key: str) -> dict[str, Any]:
    """A minimal object that deletes `key` from the store when applied as DELETED."""
    if kind == "Pod":
        return {"metadata": {"uid": key}}
    if kind in NAMESPACED_KINDS:
        namespace, _, name = key.partition("/")
        return {"metadata": {"namespace": namespace, "name": name}}
    return {"metadata": {"name": key}}


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """Newline-delimited frames of any size (StreamReader.readline caps them).
    Each chunk is split once, and a frame spanning chunks is joined once:
    under load a chunk holds hundreds of events, and cutting the rest of
    the buffer after every line copied it once per line."""
    partial: list[bytes] = []
    async for chunk in response.content.iter_any():
        if b"\n" not in chunk:
            partial.append(chunk)
            continue
        lines = chunk.split(b"\n")
        if partial:
            lines[0] = b"".join((*partial, lines[0]))
            partial = []
        tail = lines.pop()
        if tail:
            partial.append(tail)
        for line in lines:
            if line.strip():
                yield line
    rest = b"".join(partial)
    if rest.strip():
        yield rest


class Watcher:
    """Keeps one kind of the store in sync with the API server."""

    def __init__(self, api: Any, store: ClusterStore, resource: Resource, *,
                 page_size: int = 500, watch_seconds: int = 300,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0) -> None:
        self.api = api
        self.store = store
        self.resource = resource
        self.page_size = page_size
        self.watch_seconds = watch_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.resource_version: str | None = None
        self.relists = 0
        self._gauge = metrics.cache_objects.labels(resource.kind)
        # A kind whose CRD is not installed (404) is reported once, then
        # waited for quietly: arbiter works without it meanwhile.
        self._missing_reported = False

    @property
    def kind(self) -> Kind:
        return self.resource.kind

    def _count(self) -> None:
        self._gauge.set(len(self.store.table(self.kind)))

    async def relist(self, *, since: str | None = None) -> str:
        """LIST into the store; the snapshot's resourceVersion.

        With `since` (what client-go's reflector does): "0" for a watcher's
        first list, else the last resourceVersion applied (after a 410 on
        the watch) with resourceVersionMatch=NotOlderThan. The apiserver
        answers from its watch cache in one piece, no etcd read: a replica
        restarted under load synced in 40-90 s when every kind came page by
        page from etcd. Without `since`, or when the cache no longer has it
        (410), a consistent list, page by page as new as etcd.
        """
        if since is not None:
            try:
                return await self._list([("resourceVersion", since)] if since == "0" else
                                        [("resourceVersion", since),
                                         ("resourceVersionMatch", "NotOlderThan")])
            except ApiError as error:
                if error.status != 410:
                    raise
        return await self._list([("limit", str(self.page_size))])

    async def _list(self, params: list[tuple[str, str]]) -> str:
        present: set[str] = set()
        continue_token = ""
        resource_version = ""
        while True:
            query = list(params)
            if continue_token:
                query.append(("continue", continue_token))
            response = await open_stream(self.api, "GET", self.resource.path, query=query,
                                         request_timeout=120.0)
            try:
                raw = await response.read()
            finally:
                response.release()
            page = orjson.loads(raw)
            for obj in page.get("items") or ():
                self.store.apply(self.kind, "ADDED", obj)
                present.add(store_key(self.kind, obj))
            meta = page.get("metadata") or {}
            resource_version = str(meta.get("resourceVersion", ""))
            continue_token = str(meta.get("continue") or "")
            if not continue_token:
                break
        table = self.store.table(self.kind)
        for key in [k for k in table if k not in present]:
            self.store.apply(self.kind, "DELETED", _stub(self.kind, key))
        self.store.synced_kinds.add(self.kind)
        self.relists += 1
        self._count()
        log.info("listed", extra={"kind": self.kind, "objects": len(table),
                                  "resourceVersion": resource_version})
        return resource_version

    async def watch(self, resource_version: str) -> str:
        """One WATCH until the server ends it; the last resourceVersion seen."""
        query = [("watch", "1"), ("resourceVersion", resource_version),
                 ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(self.watch_seconds))]
        timeout = aiohttp.ClientTimeout(total=None, connect=15,
                                        sock_read=self.watch_seconds + 30)
        try:
            response = await open_stream(self.api, "GET", self.resource.path, query=query,
                                         request_timeout=timeout)
        except ApiError as error:
            if error.status == 410:
                raise Gone(error.message) from None
            raise
        try:
            applied = 0
            async for line in _lines(response):
                applied += 1
                if applied % YIELD_EVERY == 0:
                    # A chunk read under load holds hundreds of events, and
                    # reading the next line does not return to the event
                    # loop: let the webhook and the extender answer between.
                    await asyncio.sleep(0)
                event = orjson.loads(line)
                event_type = event.get("type")
                obj = event.get("object") or {}
                if event_type in _EVENT_TYPES:
                    self.store.apply(self.kind, cast(EventType, event_type), obj)
                    self._count()
                elif event_type == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(str(obj.get("message", "")))
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("reason", "")),
                                   str(obj.get("message", "")), obj)
                elif event_type != "BOOKMARK":
                    continue
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    resource_version = str(version)
                    self.resource_version = resource_version
        finally:
            response.release()
        return resource_version

    async def run(self) -> None:
        """List, then watch forever; never raises except on cancellation."""
        backoff = self.backoff_initial
        applied = ""  # the newest resourceVersion applied: a relist never goes back past it
        while True:
            try:
                if self.resource_version is None:
                    self.resource_version = await self.relist(since=applied or "0")
                applied = self.resource_version
                self.resource_version = await self.watch(self.resource_version)
                backoff = self.backoff_initial
            except Gone:
                log.info("resourceVersion expired; listing again", extra={"kind": self.kind})
                applied = self.resource_version or applied
                self.resource_version = None
            except (ApiError, aiohttp.ClientError, TimeoutError, OSError,
                    orjson.JSONDecodeError, ValueError, AttributeError) as error:
                # AttributeError: a frame that is JSON but not an object.
                missing = isinstance(error, ApiError) and error.status == 404
                if missing and not self._missing_reported and self.kind in WORKLOAD_KINDS:
                    self._missing_reported = True
                    log.warning("%s is not served by the API server (CRD not installed?): "
                                "its integration waits until it is", self.kind,
                                extra={"kind": self.kind, "path": self.resource.path})
                if missing and self.kind in WORKLOAD_KINDS:
                    self.store.synced_kinds.add(self.kind)  # none to list
                level = logging.DEBUG if missing else logging.WARNING
                log.log(level, "watch failed; retrying",
                        extra={"kind": self.kind, "error": str(error)[:300],
                               "retry_in": round(backoff, 2)})
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, self.backoff_max)


async def run_watchers(api: Any, store: ClusterStore,
                       resources: tuple[Resource, ...] = RESOURCES) -> None:
    """Run one watcher per kind until cancelled."""
    watchers = [Watcher(api, store, resource) for resource in resources]
    async with asyncio.TaskGroup() as group:
        for watcher in watchers:
            group.create_task(watcher.run(), name=f"watch-{watcher.kind}")
