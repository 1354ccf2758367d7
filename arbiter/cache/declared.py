"""The cache's side of declared kinds (arbiter.integrations.declared): the
tables that list workload kinds gain them once at startup, before a store
is made (a store's workload tables are made from WORKLOAD_KINDS)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import cast

from arbiter.cache import ownership, store
from arbiter.cache.workloads import workload_from_api
from arbiter.integrations import Integration


def register(integrations: Iterable[Integration], *, on: bool = True) -> None:
    """File these kinds as workloads (`on=False`: no longer; tests)."""
    for integration in integrations:
        kind = cast(store.Kind, integration.kind)
        if on:
            if kind not in store.WORKLOAD_KINDS:
                store.WORKLOAD_KINDS.append(kind)
            store.NAMESPACED_KINDS.add(kind)
            store.CONVERTERS[kind] = partial(workload_from_api, integration)
            ownership.WORKLOAD_CONSUMERS.add(kind)
        elif not on and kind in store.WORKLOAD_KINDS:
            store.WORKLOAD_KINDS.remove(kind)
            store.NAMESPACED_KINDS.discard(kind)
            store.CONVERTERS.pop(kind, None)
            ownership.WORKLOAD_CONSUMERS.discard(kind)
