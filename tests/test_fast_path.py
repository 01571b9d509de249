"""``lakeshore serve`` answers routes without path parameters past powertools' router
(handlers.api.fast_path): the answers must be the router's, byte for byte."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.handlers.api import fast_path
from dreamlake.lakeshore.server import LocalServer, _LocalContext


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    with LocalServer(tmp_path_factory.mktemp("fast") / "plane.db") as server:
        yield server


def event(method: str, path: str, body: Any, *, token: str | None, media: str) -> dict[str, Any]:
    headers = {"content-type": media, "accept": media}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    raw = (
        b""
        if body is None
        else body
        if isinstance(body, bytes)
        else (msgpack.packb(body) if media == "application/msgpack" else json.dumps(body).encode())
    )
    return apigw.http_event(method, path, headers=headers, body=raw, raw_body=True)


def both(server: LocalServer, ev: dict[str, Any]) -> tuple[Any, Any]:
    assert server.asgi is not None
    fast = fast_path(server.asgi.resolver)
    assert fast is not None
    quick = fast(ev)
    assert quick is not None, ev["rawPath"]
    routed = server.asgi.resolver.resolve(ev, _LocalContext("r"))
    return apigw.http_response(quick), apigw.http_response(routed)


@pytest.mark.parametrize("media", ["application/msgpack", "application/json"])
def test_the_fast_answers_are_the_routers(served: LocalServer, media: str) -> None:
    admin = served.admin_token
    assert admin is not None
    producer = both(
        served,
        event(
            "POST",
            "/v1/tokens",
            {"role": "producer", "queues": ["q"]},
            token=admin,
            media="application/json",
        ),
    )[0]
    scoped = json.loads(producer[2])["token"]
    sub = {"invocations": [{"queue": "q", "ref": "m:f", "id": "fixed-id-1"}]}
    result = b"r" if media == "application/msgpack" else "cg=="  # (base64 in JSON)
    cases = [
        ("GET", "/v1/hello", None, admin),
        ("POST", "/v1/invocations", sub, admin),  # a replay answers the same ids
        ("POST", "/v1/invocations/wait", {"ids": ["fixed-id-1"], "timeout": 0}, admin),
        ("POST", "/v1/claims", {"queues": ["empty"], "worker": "w"}, admin),
        ("POST", "/v1/claims", {"queues": ["q"], "worker": "w"}, scoped),  # 403: a producer
        ("POST", "/v1/claims", {"queues": ["q"], "worker": "w", "limit": 0}, admin),  # 400
        ("POST", "/v1/claims", {"queues": ["q"], "nope": 1}, admin),  # unknown field
        ("POST", "/v1/claims", b"\xc1{not a body", admin),  # malformed
        ("POST", "/v1/claims", {"queues": ["q"], "worker": "w"}, None),  # 401
        (
            "POST",
            "/v1/completions",
            {"results": [{"id": "x", "lease_token": "t", "result": result}]},
            admin,
        ),
    ]
    statuses = set()
    for method, path, body, token in cases:
        quick, routed = both(served, event(method, path, body, token=token, media=media))
        if path == "/v1/hello":  # (it tells the plane's time)
            quick = (quick[0], quick[1], b"")
            routed = (routed[0], routed[1], b"")
        assert quick == routed, (path, body)
        statuses.add(quick[0])
    assert statuses >= {200, 400, 401, 403}


def test_routes_with_path_parameters_and_unknown_paths_go_to_the_router(
    served: LocalServer,
) -> None:
    assert served.asgi is not None
    fast = fast_path(served.asgi.resolver)
    assert fast is not None
    for path in ("/v1/queues/q", "/v1/nothing", "/ui/"):
        assert (
            fast(event("GET", path, None, token=served.admin_token, media="application/json"))
            is None
        )
    # and a method the route does not take is the router's too (its 405)
    assert fast(event("DELETE", "/v1/claims", None, token=None, media="application/json")) is None
