"""The arbiter.dev names: what the API server and the CRDs expect, spelled once."""

from __future__ import annotations

import pytest

from arbiter.core.api import (
    API_KINDS,
    API_PATH,
    API_VERSION,
    MAX_NAME,
    POOL,
    QUEUE,
    QUEUE_UNIT,
    compare_resource_versions,
    format_rfc3339,
    group_unit_name,
    is_arbiter_key,
    parse_rfc3339,
    parse_time,
)


def test_group_version_and_collections() -> None:
    assert API_VERSION == "arbiter.dev/v1alpha1"
    assert QUEUE.path == "/apis/arbiter.dev/v1alpha1/queues" and not QUEUE.namespaced
    assert QUEUE_UNIT.path == f"{API_PATH}/queueunits" and QUEUE_UNIT.namespaced
    assert [kind.kind for kind in API_KINDS] == [
        "Queue", "QueueUnit", "JobFlow", "JobTemplate", "Pool", "AdmissionCheck"]
    assert POOL.path == f"{API_PATH}/pools" and not POOL.namespaced


def test_arbiter_keys() -> None:
    assert is_arbiter_key("arbiter.dev/queue")
    assert not is_arbiter_key("demo.arbiter.dev/run") and not is_arbiter_key("arbiter.dev")


def test_long_names_are_cut_and_hashed_within_the_limit() -> None:
    assert group_unit_name("g") == "group-g"
    long_name = group_unit_name("g" * 300)
    assert len(long_name) <= MAX_NAME and long_name != group_unit_name("g" * 299 + "h")


def test_times_round_trip_in_whole_seconds_utc() -> None:
    assert format_rfc3339(1_700_000_000.9) == "2023-11-14T22:13:20Z"
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000.0
    assert parse_time("2023-11-14T23:13:20+01:00") == 1_700_000_000.0
    assert parse_rfc3339(format_rfc3339(1_700_000_000)) == 1_700_000_000.0


def test_absent_and_malformed_times() -> None:
    # Converting an object: absent is 0.0, malformed rejects the object.
    assert parse_time(None) == 0.0 and parse_time("") == 0.0
    with pytest.raises(ValueError):
        parse_time("yesterday")
    # A stamp the loop only consults: absent or malformed is None.
    assert parse_rfc3339(None) is None and parse_rfc3339("yesterday") is None


@pytest.mark.parametrize(("a", "b", "order"), [
    ("9", "10", -1), ("10", "10", 0), ("11", "10", 1),
    ("123456789012345678901", "99", 1),  # past 64 bits: by length, then digits
    ("", "1", None), ("01", "1", None), ("0", "1", None), ("1a", "1", None),
    ("\uff11", "1", None),  # a digit, but not an ASCII one
])
def test_resource_versions_compare_as_apimachinery_does(a: str, b: str,
                                                        order: int | None) -> None:
    assert compare_resource_versions(a, b) == order
    if order is not None:
        assert compare_resource_versions(b, a) == -order
