"""Input a tenant or an approver controls never stops the loop or fails late:
annotations the webhook would refuse (or set while it was down) read as
absent; an approval message longer than the CRD allows is refused up front."""

from __future__ import annotations

import argparse

import pytest

from arbiter.cache.records import JobRecord
from arbiter.cli.approve import MAX_MESSAGE, _message
from arbiter.core.api import MIN_PARALLELISM_ANNOTATION
from arbiter.loop.placement import Placed
from arbiter.loop.units import min_parallelism


def job(value: str, parallelism: int = 8) -> JobRecord:
    return JobRecord("uid", "ns", "j", parallelism=parallelism,
                     annotations=((MIN_PARALLELISM_ANNOTATION, value),))


def test_min_parallelism_reads_only_short_ascii_whole_numbers() -> None:
    assert min_parallelism(job("3")) == 3
    assert min_parallelism(job(" 12 ")) == 8  # capped at parallelism
    for bad in ("²", "٣", "9" * 5000, "0", "-1", "1.5", ""):
        assert min_parallelism(job(bad)) is None, bad


def test_a_deeply_nested_placed_annotation_undoes_nothing() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    placed = Placed.from_annotation(deep)
    assert (placed.node_selector, placed.replaced, placed.tolerations) == ({}, {}, [])


def test_an_approval_message_longer_than_the_crd_allows_is_refused_up_front() -> None:
    assert _message("ok") == "ok" and _message("x" * MAX_MESSAGE) == "x" * MAX_MESSAGE
    with pytest.raises(argparse.ArgumentTypeError, match="at most 1024"):
        _message("x" * (MAX_MESSAGE + 1))
