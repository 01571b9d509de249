"""The Lambda entry point answers API Gateway v2 events and emits request metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dreamlake.lakeshore.api import bootstrap_admin
from dreamlake.lakeshore.handlers import api as handler_module
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.stores import SqliteStore


@pytest.fixture
def plane_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    path = str(tmp_path / "plane.db")
    monkeypatch.setenv("LAKESHORE_PLANE", path)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Lakeshore")
    yield path
    handler_module._lambda_app = None


def test_lambda_handler_answers_and_counts_requests(
    plane_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a plane file with an admin token
    plane = Plane(SqliteStore(plane_file))
    token = bootstrap_admin(plane)
    plane.close()
    # When API Gateway sends a hello and an unauthorised request
    ok = handler_module.handler(
        apigw.http_event("GET", "/v1/hello", headers={"authorization": f"Bearer {token}"}), None
    )
    denied = handler_module.handler(apigw.http_event("GET", "/v1/hello"), None)
    # Then the answers are v2 responses
    assert ok["statusCode"] == 200
    assert json.loads(ok["body"])["identity"]["role"] == "admin"
    assert denied["statusCode"] == 401
    # And each request emitted CloudWatch EMF metrics
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert [m.get("Requests") for m in emf] == [[1.0], [1.0]]
    assert emf[1].get("ClientErrors") == [1.0]
