"""Workload integrations (DESIGN §14): one `Integration` per kind, switched
on by `--integrations`. Job and plain pods are always on."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from arbiter.integrations.base import Integration
from arbiter.integrations.deployment import Deployment
from arbiter.integrations.job import Job, Pod
from arbiter.integrations.jobset import JobSet
from arbiter.integrations.lws import LeaderWorkerSet
from arbiter.integrations.ray import RayCluster, RayJob
from arbiter.integrations.statefulset import StatefulSet
from arbiter.integrations.trainjob import TrainJob

BUILTIN: tuple[Integration, ...] = (Job(), Pod())
OPTIONAL: tuple[Integration, ...] = (JobSet(), StatefulSet(), Deployment(), LeaderWorkerSet(),
                                     TrainJob(), RayCluster(), RayJob())
BY_NAME: dict[str, Integration] = {i.name: i for i in (*BUILTIN, *OPTIONAL)}
BY_KIND: dict[str, Integration] = {i.kind: i for i in (*BUILTIN, *OPTIONAL)}
DEFAULT_NAMES: tuple[str, ...] = tuple(i.name for i in OPTIONAL)


def parse_names(text: str) -> tuple[str, ...]:
    """`--integrations`: comma-separated names, `all` or `none`. Raises
    ValueError naming an unknown one and the known ones."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    if words == ["all"]:
        return DEFAULT_NAMES
    if words in ([], ["none"]):
        return ()
    unknown = [w for w in words if w not in BY_NAME or BY_NAME[w] in BUILTIN]
    if unknown:
        raise ValueError(f"unknown integration {unknown[0]!r}; known: "
                         f"{', '.join(DEFAULT_NAMES)} (or all, none)")
    return tuple(dict.fromkeys(words))


@functools.cache
def held_kinds(integrations: tuple[Integration, ...]) -> frozenset[str]:
    """The kinds of `integrations` that hold their work (all but per-pod
    ones): computed once per set switched on, read per pod by the owner walk."""
    return frozenset(i.kind for i in integrations if not i.per_pod)


def enabled(names: Iterable[str]) -> tuple[Integration, ...]:
    """The optional integrations named (in the order of OPTIONAL)."""
    wanted = set(names)
    return tuple(i for i in OPTIONAL if i.name in wanted)


def declare(integrations: Iterable[Integration], *, on: bool = True) -> None:
    """Declared kinds (arbiter.integrations.declared) join the registry by
    kind, once at startup before anything reads it; `on=False` takes them
    off again (tests)."""
    for integration in integrations:
        if on:
            BY_KIND[integration.kind] = BY_NAME[integration.name] = integration
        else:
            BY_KIND.pop(integration.kind, None)
            BY_NAME.pop(integration.name, None)


__all__ = ["BUILTIN", "BY_KIND", "BY_NAME", "DEFAULT_NAMES", "OPTIONAL", "Integration",
           "declare", "enabled", "held_kinds", "parse_names"]
