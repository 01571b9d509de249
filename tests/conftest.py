"""Shared fixtures: factories that clean up what they built.

The test run never touches the developer's own planes: LAKESHORE_HOME and the auth file
point into a temporary folder, and LAKESHORE_URL/TOKEN/PROFILE are unset.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.server import LocalServer, PlaneASGI


def pytest_configure(config: pytest.Config) -> None:
    home = tempfile.mkdtemp(prefix="lakeshore-test-home-")
    os.environ["LAKESHORE_HOME"] = home
    os.environ["LAKESHORE_AUTH_FILE"] = os.path.join(home, "auth.yml")
    for name in ("LAKESHORE_URL", "LAKESHORE_TOKEN", "LAKESHORE_PROFILE"):
        os.environ.pop(name, None)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def dispatch() -> Iterator[dls.Dispatch]:
    """An embedded in-memory plane, closed after the test."""
    dp = dls.Dispatch(":memory:")
    yield dp
    dp.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[LocalServer]:
    """``lakeshore serve`` on a plane file in the test's folder, stopped after."""
    server = LocalServer(tmp_path / "plane.db")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def parts(served: LocalServer) -> tuple[Plane, PlaneASGI]:
    """The plane and the ASGI app of ``served`` (for tests that look inside the server)."""
    assert served.plane is not None and served.asgi is not None
    return served.plane, served.asgi
