"""Shared fixtures: factories that clean up what they built."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def dispatch() -> Iterator[dls.Dispatch]:
    """An embedded in-memory plane, closed after the test."""
    dp = dls.Dispatch(":memory:")
    yield dp
    dp.close()
