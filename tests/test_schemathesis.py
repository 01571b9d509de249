"""infra/openapi.yaml, fuzzed by schemathesis against a live ``lakeshore serve``.

Schemathesis generates requests from the document (the examples it names, boundary and
negative cases of every schema — the coverage phase — and random valid ones), sends
them over HTTP to a served plane with an admin token, and checks each answer: not a
server error, a status code the operation lists, a content type it lists, and a body
that matches the schema of that status. Requests go out in JSON and in msgpack (both
media types each operation declares); msgpack answers are checked as their JSON twins
(bytes become base64, as the document describes them).

Bounded: a few generated examples per operation, no deadline, no shrinking, and a
shared time budget after which the remaining operations send their first cases only.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, reject, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from dreamlake.lakeshore.server import serve_in_thread

SPEC = Path(__file__).resolve().parent.parent / "infra" / "openapi.yaml"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
#: seconds the whole run may take; past it each operation stops after its first cases
BUDGET = 30.0
#: generated (fuzzing-phase) examples per operation
EXAMPLES = 8


def _jsonable(value: Any) -> Any:
    """A msgpack answer as its JSON twin: bytes become base64 strings."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


@schemathesis.serializer("application/msgpack")
def _to_msgpack(ctx: schemathesis.SerializationContext, value: Any) -> bytes | None:
    if value is None:
        return None
    try:
        out: bytes = msgpack.packb(value, use_bin_type=True)
    except (OverflowError, ValueError):
        # an integer past 64 bits: msgpack cannot carry it (JSON examples do)
        reject()
    return out


@schemathesis.deserializer("application/msgpack")
def _from_msgpack(ctx: schemathesis.DeserializationContext, response: schemathesis.Response) -> Any:
    return _jsonable(msgpack.unpackb(response.content, raw=False))


schema = schemathesis.openapi.from_path(SPEC)


class Served:
    """The served plane, and the clock of the shared budget."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token
        self.started = time.monotonic()
        self.requests = 0

    @property
    def over_budget(self) -> bool:
        return time.monotonic() - self.started > BUDGET


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    plane_file = tmp_path_factory.mktemp("schemathesis") / "plane.db"
    with serve_in_thread(plane_file) as (url, token):
        assert token is not None
        yield Served(url, token)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_the_served_api_keeps_the_document(case: schemathesis.Case[Any], served: Served) -> None:
    if served.over_budget and served.requests:
        return  # the budget is spent: later examples of this operation are not sent
    served.requests += 1
    case.call_and_validate(
        base_url=served.url,
        headers={"Authorization": f"Bearer {served.token}"},
        checks=CHECKS,
        timeout=30,
    )
