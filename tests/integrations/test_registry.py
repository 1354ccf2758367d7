"""`--integrations`: which optional integrations are switched on."""

from __future__ import annotations

import pytest

from arbiter.integrations import (
    BUILTIN,
    BY_KIND,
    BY_NAME,
    DEFAULT_NAMES,
    OPTIONAL,
    enabled,
    parse_names,
)


def test_all_names_every_optional_integration() -> None:
    assert parse_names("all") == DEFAULT_NAMES == ("jobset", "statefulset", "deployment", "lws",
                                                   "trainer", "raycluster", "rayjob")
    assert parse_names(" all ") == DEFAULT_NAMES


def test_none_and_empty_switch_every_optional_one_off() -> None:
    assert parse_names("none") == ()
    assert parse_names("") == ()
    assert parse_names(" , ") == ()


def test_a_list_keeps_its_order_without_repeats() -> None:
    assert parse_names("lws,jobset") == ("lws", "jobset")
    assert parse_names(" jobset , lws, jobset,") == ("jobset", "lws")


@pytest.mark.parametrize("text", ["ray", "jobset,rayservice", "JobSet", "job", "pod",
                                  "all,jobset", "none,lws"])
def test_an_unknown_or_builtin_name_is_refused_naming_it_and_the_known(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_names(text)
    message = str(caught.value)
    bad = next(w.strip() for w in text.split(",")
               if w.strip() not in DEFAULT_NAMES)
    assert repr(bad) in message
    assert all(name in message for name in DEFAULT_NAMES)


def test_enabled_follows_the_registry_order_and_ignores_unknown() -> None:
    assert [i.name for i in enabled(["lws", "jobset"])] == ["jobset", "lws"]
    assert enabled([]) == ()
    assert enabled(["job", "nope"]) == ()
    assert enabled(parse_names("all")) == OPTIONAL


def test_registry_is_one_integration_per_name_and_kind() -> None:
    everything = (*BUILTIN, *OPTIONAL)
    assert len(BY_NAME) == len(BY_KIND) == len(everything)
    for integration in everything:
        assert BY_NAME[integration.name] is integration
        assert BY_KIND[integration.kind] is integration
        assert integration.prefix and integration.resource and integration.version
    # Unit name prefixes never collide (a unit's name says whose it is).
    assert len({i.prefix for i in everything}) == len(everything)
    assert {i.name for i in BUILTIN} == {"job", "pod"}
    assert {i.kind for i in OPTIONAL if i.group not in ("", "apps", "batch")} == \
        {"JobSet", "LeaderWorkerSet", "TrainJob", "RayCluster", "RayJob"}
