"""Bad input, fuzzed: the decoders and every route answer a 4xx with a reason, never a 500.

Hypothesis drives the body codec (``api.codec.decode_body``), the wire decoders
(``wire.unpack``, ``decode_payload``, ``decode_result``, ``decode_error``) and every route
of the handler with arbitrary, truncated, deeply nested, oversized and wrong-typed input.
A decoder may return a value or raise one of the 4xx classes meant for bad input; the
handler may answer anything below 500, and when it answers a 4xx nothing stored has
changed (every table of the SQLite plane is compared before and after). Declared lengths
are checked to cost no memory: a 10-byte body claiming 2 GiB must not allocate it.

Example counts are bounded so the file runs in seconds, and a failing example is
reported as found, without shrinking, so a failing run is as quick as a passing one.
The hypothesis database is off (nothing is written to the work tree): each run
explores afresh, and the deterministic tables below pin every fault found so far.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import pickle
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from dreamlake.lakeshore import wire
from dreamlake.lakeshore.api import Limits, Service, bootstrap_admin, create_token
from dreamlake.lakeshore.api.codec import decode_body
from dreamlake.lakeshore.errors import (
    InvalidRequest,
    PayloadTooLarge,
    SerializationError,
    UnsupportedMediaType,
)
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.handlers.api import make_app
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.plane.model import QueueSpec, Submission
from dreamlake.lakeshore.stores import SqliteStore

MP = "application/msgpack"
JS = "application/json"
#: what a decoder may raise on bad input: the 4xx classes meant for it
BAD_INPUT = (InvalidRequest, PayloadTooLarge, UnsupportedMediaType)
#: bytes of peak allocation a decoder may spend on a body of a few bytes
SMALL = 256 * 1024

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    # a failure is reported as found, unshrunk: a failing run stays as quick as a passing one
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _mp(value: Any) -> bytes:
    out: bytes = msgpack.packb(value, use_bin_type=True)
    return out


# --- strategies ---------------------------------------------------------------------------

#: field names of the API's bodies, so random maps reach past "unknown field"
FIELDS = [
    "add_queues",
    "anneal",
    "args",
    "args_ref",
    "backoff",
    "check",
    "chunks",
    "cmd",
    "concurrency",
    "create",
    "cwd",
    "data",
    "delay",
    "delete_when_drained",
    "digest",
    "digests",
    "elasticity",
    "env",
    "error",
    "exec",
    "failures",
    "fn",
    "fraction",
    "host",
    "id",
    "ids",
    "invocations",
    "key",
    "keys",
    "kind",
    "kwargs",
    "lease_seconds",
    "lease_token",
    "leases",
    "limit",
    "max",
    "max_attempts",
    "max_backoff",
    "message",
    "name",
    "older_than",
    "payload",
    "pickle_protocols",
    "pickled",
    "priority",
    "priority_field",
    "python",
    "queue",
    "queues",
    "ref",
    "remove_queues",
    "result",
    "results",
    "retry",
    "retryable",
    "role",
    "running",
    "target",
    "temperature",
    "timeout",
    "traceback",
    "type",
    "v",
    "wait",
    "worker",
]
#: numbers at the edges: of floats, of 64-bit integers, of anything a float can hold
EDGE_NUMBERS: list[Any] = [
    0,
    -1,
    2**31,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    1e308,
    -1e308,
    5e-324,
    math.inf,
    -math.inf,
    math.nan,
]
#: a string JSON can carry (as "\\ud800") that no UTF-8 encoder takes
LONE_SURROGATE = "\ud800"
#: integers only JSON can carry (msgpack stops at 64 bits)
HUGE_INTS: list[Any] = [2**64, -(2**63) - 1, 10**30, 10**400]


def scalars(with_bytes: bool) -> st.SearchStrategy[Any]:
    options: list[st.SearchStrategy[Any]] = [
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.sampled_from(EDGE_NUMBERS),
        st.sampled_from(["team-a", "p", "r", "m:f", "math:sqrt", "*", ""]),
    ]
    if with_bytes:
        options.append(st.binary(max_size=24))
    else:
        options.append(st.sampled_from([*HUGE_INTS, LONE_SURROGATE]))
    return st.one_of(options)


def values(with_bytes: bool) -> st.SearchStrategy[Any]:
    keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=6))
    return st.recursive(
        scalars(with_bytes),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)
        ),
        max_leaves=12,
    )


def maps(with_bytes: bool) -> st.SearchStrategy[dict[str, Any]]:
    keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=6))
    return st.dictionaries(keys, values(with_bytes), max_size=6)


# --- the body codec -----------------------------------------------------------------------

CONTENT_TYPES = [MP, "application/x-msgpack", JS, "application/json; charset=utf-8", "", None]


@FUZZ
@given(
    body=st.binary(max_size=300),
    ctype=st.sampled_from([*CONTENT_TYPES, "text/plain", "application/xml"]),
)
def test_decode_body_on_arbitrary_bytes(body: bytes, ctype: str | None) -> None:
    try:
        value = decode_body(body, ctype, max_body=256)
    except BAD_INPUT as exc:
        assert str(exc)
    else:
        assert isinstance(value, dict)


@FUZZ
@given(value=maps(with_bytes=True), data=st.data())
def test_decode_body_on_truncated_msgpack(value: dict[str, Any], data: st.DataObject) -> None:
    body = _mp(value)
    cut = data.draw(st.integers(min_value=1, max_value=max(1, len(body) - 1)))
    truncated = body[:cut]
    if len(truncated) == len(body):
        return
    # A strict prefix of a msgpack map is never a whole map
    with pytest.raises(InvalidRequest):
        decode_body(truncated, MP, max_body=1 << 20)


@FUZZ
@given(value=maps(with_bytes=False), data=st.data())
def test_decode_body_on_truncated_json(value: dict[str, Any], data: st.DataObject) -> None:
    body = json.dumps(value).encode()
    cut = data.draw(st.integers(min_value=1, max_value=len(body) - 1))
    with pytest.raises(InvalidRequest):
        decode_body(body[:cut], JS, max_body=1 << 20)


def _storable(value: Any) -> bool:
    """Whether every number fits a store: finite floats, integers within 64 bits."""
    if isinstance(value, dict):
        return all(_storable(v) for v in value.values())
    if isinstance(value, list):
        return all(_storable(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 2**63
    return True


@FUZZ
@given(value=maps(with_bytes=True))
def test_decode_body_accepts_what_msgpack_encodes_and_a_store_holds(value: dict[str, Any]) -> None:
    if _storable(value):
        assert _mp(decode_body(_mp(value), MP, max_body=1 << 20)) == _mp(value)
    else:  # NaN, infinities and integers past 64 bits are refused up front
        with pytest.raises(InvalidRequest):
            decode_body(_mp(value), MP, max_body=1 << 20)


@pytest.mark.parametrize(
    "body",
    [b'{"a": "\\ud800"}', b'{"\\udfff": 1}', b'{"a": [{"b": "x\\udc80y"}]}'],
    ids=["a value", "a key", "nested"],
)
def test_decode_body_refuses_json_strings_utf8_cannot_encode(body: bytes) -> None:
    # JSON's \\uXXXX escapes can name a lone surrogate, which no answer, store or log
    # line can encode later: the body is bad input now
    with pytest.raises(InvalidRequest):
        decode_body(body, JS, max_body=1 << 20)


def _nested_arrays(depth: int) -> bytes:
    return b"\x81\xa1a" + b"\x91" * depth + b"\xc0"


def _nested_maps(depth: int) -> bytes:
    return b"\x81\xa1a" * depth + b"\xc0"


DEEP = [
    pytest.param(_nested_arrays(40), MP, id="msgpack arrays 40 deep"),
    pytest.param(_nested_arrays(100_000), MP, id="msgpack arrays 100k deep"),
    pytest.param(_nested_maps(40), MP, id="msgpack maps 40 deep"),
    pytest.param(_nested_maps(100_000), MP, id="msgpack maps 100k deep"),
    pytest.param(b'{"a":' + b"[" * 40 + b"]" * 40 + b"}", JS, id="json arrays 40 deep"),
    pytest.param(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", JS, id="json arrays 100k"),
    pytest.param(b'{"a":' * 100_000 + b"1" + b"}" * 100_000, JS, id="json maps 100k deep"),
    pytest.param(b'{"a":' + b"[" * 100_000, JS, id="json unclosed 100k deep"),
]


@pytest.mark.parametrize(("body", "ctype"), DEEP)
def test_deeply_nested_bodies_are_400(body: bytes, ctype: str) -> None:
    with pytest.raises(InvalidRequest, match=r"nest|malformed"):
        decode_body(body, ctype, max_body=1 << 20)


def _claims(header: bytes) -> bytes:
    """A 10-ish byte map whose one value declares a length it does not have."""
    return b"\x81\xa1a" + header + b"xxxxx"


HUGE_HEADERS = [
    pytest.param(b"\xc6" + struct.pack(">I", 2**31), id="bin32 of 2 GiB"),
    pytest.param(b"\xc6" + struct.pack(">I", 2**32 - 1), id="bin32 of 4 GiB"),
    pytest.param(b"\xdb" + struct.pack(">I", 2**32 - 1), id="str32 of 4 GiB"),
    pytest.param(b"\xdd" + struct.pack(">I", 2**32 - 1), id="array32 of 4G items"),
    pytest.param(b"\xdf" + struct.pack(">I", 2**32 - 1), id="map32 of 4G pairs"),
    pytest.param(b"\xc9" + struct.pack(">I", 2**31) + b"\x01", id="ext32 of 2 GiB"),
]


def _peak(fn: Callable[[], Any]) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    try:
        fn()
        raised = None
    except BaseException as exc:  # judged by the caller
        raised = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, raised


@pytest.mark.parametrize("header", HUGE_HEADERS)
def test_a_declared_length_costs_nothing_in_decode_body(header: bytes) -> None:
    body = _claims(header)
    peak, raised = _peak(lambda: decode_body(body, MP, max_body=1 << 20))
    assert isinstance(raised, InvalidRequest), raised
    assert peak < SMALL, f"{len(body)}-byte body allocated {peak} bytes"


@pytest.mark.parametrize("header", HUGE_HEADERS)
def test_a_declared_length_costs_nothing_in_the_wire_decoders(header: bytes) -> None:
    body = _claims(header)
    for decoder in (wire.unpack, wire.decode_payload, wire.decode_result):
        peak, raised = _peak(lambda d=decoder: d(body))  # type: ignore[misc]
        assert isinstance(raised, InvalidRequest), (decoder.__name__, raised)
        assert peak < SMALL, f"{decoder.__name__}: {len(body)} bytes allocated {peak}"
    # and a bare header, not inside a map, the same
    peak, raised = _peak(lambda: wire.unpack(header))
    assert isinstance(raised, InvalidRequest) and peak < SMALL


def test_bodies_over_the_limits_are_refused_before_decoding() -> None:
    with pytest.raises(PayloadTooLarge):
        decode_body(b"\x80" + b"\x00" * 1024, MP, max_body=1024)
    over = bytes(wire._MAX_BUFFER + 1)
    with pytest.raises(InvalidRequest, match="over the"):
        wire.unpack(over)


# --- the wire decoders ------------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=300))
def test_unpack_and_decode_payload_on_arbitrary_bytes(data: bytes) -> None:
    for decoder in (wire.unpack, wire.decode_payload):
        try:
            decoder(data)
        except InvalidRequest as exc:
            assert str(exc)


PAYLOAD_KEYS = ["v", "kind", "fn", "args", "args_ref", "target", "kwargs", "cmd", "env", "cwd"]
KINDS = st.one_of(
    st.sampled_from(["pickle", "ref", "exec", "msgpack", "data", "blob"]), values(True)
)


def envelopes() -> st.SearchStrategy[dict[str, Any]]:
    """Maps shaped like envelopes: the right keys, any values, v mostly 1."""
    return st.fixed_dictionaries(
        {"v": st.one_of(st.just(1), values(True)), "kind": KINDS},
        optional={k: values(True) for k in PAYLOAD_KEYS[2:]},
    )


@FUZZ
@given(env=envelopes())
def test_decode_payload_on_envelope_shaped_maps(env: dict[str, Any]) -> None:
    try:
        got = wire.decode_payload(_mp(env))
    except InvalidRequest as exc:
        assert str(exc)
    else:
        assert got["kind"] in ("pickle", "ref", "exec")


@pytest.mark.parametrize(
    "env",
    [
        {"v": 1, "kind": [1]},
        {"v": 1, "kind": {"a": 1}},
        {"v": [1], "kind": "ref"},
    ],
    ids=["kind is a list", "kind is a map", "v is a list"],
)
def test_decode_payload_refuses_unhashable_fields(env: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        wire.decode_payload(_mp(env))


@FUZZ
@given(data=st.binary(max_size=300))
def test_decode_result_on_arbitrary_bytes(data: bytes) -> None:
    try:
        wire.decode_result(data)
    except InvalidRequest as exc:
        assert str(exc)


@FUZZ
@given(
    env=st.fixed_dictionaries(
        {"v": st.one_of(st.just(1), values(False)), "kind": KINDS},
        optional={"data": values(False), "value": values(True), "digest": values(True)},
    )
)
def test_decode_result_on_envelope_shaped_maps(env: dict[str, Any]) -> None:
    # (``data`` is never bytes here: unpickling random bytes is not this test's business)
    try:
        body = _mp(env)
    except (UnicodeEncodeError, OverflowError):  # not msgpack-able: not an envelope
        assume(False)
    try:
        wire.decode_result(body)
    except InvalidRequest as exc:
        assert str(exc)


@pytest.mark.parametrize(
    "env",
    [
        {"v": 1, "kind": "pickle"},
        {"v": 1, "kind": "pickle", "data": "not bytes"},
        {"v": 1, "kind": "pickle", "data": 7},
        {"v": 1, "kind": "pickle", "data": b"not a pickle"},
        {"v": 1, "kind": "pickle", "data": pickle.dumps([1, 2])[:-3]},
    ],
    ids=["no data", "data is a str", "data is an int", "data is not a pickle", "truncated"],
)
def test_a_broken_pickle_result_is_a_client_error(env: dict[str, Any]) -> None:
    with pytest.raises((InvalidRequest, SerializationError)):
        wire.decode_result(_mp(env))


ERROR_FIELDS = {
    "type": values(True),
    "message": values(True),
    "traceback": values(True),
    "pickled": st.one_of(
        st.none(),
        st.binary(max_size=48),
        st.sampled_from(
            [
                pickle.dumps(ValueError("v")),
                pickle.dumps({"not": "an exception"}),
                pickle.dumps(KeyError("k"))[:-2],
            ]
        ),
        values(True),
    ),
}


@FUZZ
@given(error=st.fixed_dictionaries({}, optional=ERROR_FIELDS))
def test_decode_error_always_returns_an_exception(error: dict[str, Any]) -> None:
    exc = wire.decode_error(error)
    assert isinstance(exc, BaseException)


# --- every route, through the handler ------------------------------------------------------


@dataclass
class World:
    plane: Plane
    app: Any
    tokens: dict[str, str]
    ids: dict[str, str]


def build_world() -> World:
    plane = Plane(SqliteStore(":memory:"))
    app = make_app(Service(plane, limits=Limits(max_body=64 * 1024, max_wait=0.01)))
    admin = bootstrap_admin(plane)
    assert admin is not None
    producer, _ = create_token(plane, "producer", ["team-a*"])
    worker, _ = create_token(plane, "worker", ["team-a*"])
    _, victim_rec = create_token(plane, "producer")
    plane.ensure_queue(QueueSpec("team-a"))
    payload = wire.encode_ref_call("math:sqrt", (4.0,), {}).payload
    plane.submit([Submission(id=i, queue="team-a", payload=payload) for i in ("r", "f")])
    claims = {c.id: c for c in plane.claim(["team-a"], "w", limit=2)}
    plane.fail("f", claims["f"].lease_token, wire.encode_error(ValueError("x")), retryable=False)
    plane.submit([Submission(id="p", queue="team-a", payload=payload)])
    daemon = plane.register_daemon("d", queues=["team-a"])
    blob = b"blob"
    digest = hashlib.sha256(blob).hexdigest()
    plane.put_blob(digest, blob)
    ids = {
        "name": "team-a",
        "pending": "p",
        "running": "r",
        "lease": claims["r"].lease_token,
        "failed": "f",
        "daemon": daemon.id,
        "digest": digest,
        "token": victim_rec.id,
    }
    return World(plane, app, {"admin": admin, "producer": producer, "worker": worker}, ids)


@pytest.fixture
def world() -> Iterator[World]:
    w = build_world()
    yield w
    w.plane.close()


def snapshot(plane: Plane) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in a stable order."""
    db = plane.store._db  # type: ignore[attr-defined]
    names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {n: sorted(db.execute(f"SELECT * FROM {n}").fetchall(), key=repr) for n in names}


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any


def send(
    w: World, method: str, path: str, body: bytes, ctype: str, token: str, query: str = ""
) -> Reply:
    headers = {"content-type": ctype, "authorization": f"Bearer {token}"}
    event = apigw.http_event(method, path, headers=headers, body=body, query_string=query)
    status, hdrs, data = apigw.http_response(w.app.resolve(event, None))
    media = dict((k.lower(), v) for k, v in hdrs).get("content-type", "")
    parsed: Any = data
    if data and media.startswith(MP):
        parsed = msgpack.unpackb(data, raw=False)
    elif data and media.startswith(JS):
        parsed = json.loads(data)
    return Reply(status, parsed)


def check_answer(w: World, before: dict[str, Any], reply: Reply) -> None:
    """Below 500; a 4xx has a one-line reason and changed nothing stored."""
    assert reply.status < 500, reply.body
    if reply.status >= 400:
        error = reply.body["error"]
        assert error["code"] and error["message"]
        assert "\n" not in error["message"]
        assert snapshot(w.plane) == before, f"a {reply.status} changed the store"


#: every route with a valid body (path parameters by name from World.ids)
VALID: dict[tuple[str, str], dict[str, Any] | None] = {
    ("GET", "/v1/hello"): None,
    ("POST", "/v1/queues"): {"name": "team-a-2", "kind": "priority"},
    ("GET", "/v1/queues"): None,
    ("POST", "/v1/queues/prune"): {"older_than": 60},
    ("GET", "/v1/queues/{name}"): None,
    ("PATCH", "/v1/queues/{name}"): {"retry": {"max": 1, "backoff": 1.0}},
    ("DELETE", "/v1/queues/{name}"): None,
    ("POST", "/v1/invocations"): {
        "invocations": [{"queue": "team-a", "ref": "math:sqrt", "args": [4], "priority": 1}]
    },
    ("GET", "/v1/invocations"): None,
    ("POST", "/v1/invocations/wait"): {"ids": ["p"], "timeout": 0},
    ("GET", "/v1/invocations/{pending}"): None,
    ("PATCH", "/v1/invocations/{pending}"): {"priority": 2},
    ("POST", "/v1/invocations/{pending}/cancel"): None,
    ("POST", "/v1/invocations/{failed}/retry"): None,
    ("GET", "/v1/invocations/{running}/logs"): None,
    ("POST", "/v1/claims"): {"queues": ["team-a"], "worker": "w2", "limit": 1},
    ("POST", "/v1/heartbeats"): {"leases": [{"id": "r", "lease_token": "{lease}"}]},
    ("POST", "/v1/completions"): {
        "results": [{"id": "r", "lease_token": "{lease}", "result": wire.encode_result(0)[0]}]
    },
    ("POST", "/v1/failures"): {
        "failures": [{"id": "r", "lease_token": "{lease}", "error": {"message": "m"}}]
    },
    ("POST", "/v1/releases"): {"leases": [{"id": "r", "lease_token": "{lease}"}]},
    ("POST", "/v1/logs"): {"id": "r", "lease_token": "{lease}", "chunks": [[1, "stdout", "x"]]},
    ("POST", "/v1/progress"): {"id": "r", "lease_token": "{lease}", "fraction": 0.5},
    ("POST", "/v1/blobs/missing"): {"digests": ["{digest}"]},
    ("PUT", "/v1/blobs/{digest}"): None,
    ("GET", "/v1/blobs/{digest}"): None,
    ("GET", "/v1/blobs/{digest}/url"): None,
    ("POST", "/v1/data"): {"key": "k", "digest": "{digest}"},
    ("POST", "/v1/data/lookup"): {"keys": ["k"]},
    ("POST", "/v1/daemons"): {"name": "d2", "queues": ["team-a"], "pickle_protocols": [5]},
    ("POST", "/v1/daemons/{daemon}/heartbeat"): {"running": 1},
    ("GET", "/v1/daemons"): None,
    ("PATCH", "/v1/daemons/{daemon}"): {"add_queues": ["team-a"], "concurrency": 2},
    ("POST", "/v1/daemons/{daemon}/drain"): None,
    ("POST", "/v1/tokens"): {"role": "producer", "queues": ["team-a*"], "name": "n"},
    ("GET", "/v1/tokens"): None,
    ("DELETE", "/v1/tokens/{token}"): None,
}
QUERY_KEYS = ["queue", "state", "limit", "cursor", "after", "force", "expires", "sig"]


def _fill(value: Any, ids: dict[str, str]) -> Any:
    """Put the world's lease token and digest where a valid body has placeholders."""
    if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
        return ids[value[1:-1]]
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    return value


def _path(template: str, ids: dict[str, str], override: str | None) -> str:
    out = template
    for name, value in ids.items():
        out = out.replace("{" + name + "}", override if override is not None else value)
    return out


def _mutate(body: dict[str, Any], data: st.DataObject, with_bytes: bool) -> dict[str, Any]:
    """A valid body with one field (at the top or one level down) set to junk, removed,
    or joined by an unknown one."""
    out: dict[str, Any] = json.loads(
        json.dumps(body, default=lambda b: base64.b64encode(b).decode())
    )
    target = out
    inner = [v[0] for v in out.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
    down = data.draw(st.booleans(), label="one level down")
    if inner and down:
        target = inner[0]
    how = data.draw(st.sampled_from(["junk", "drop", "extra"]), label="mutation")
    if how == "extra":
        target[data.draw(st.text(min_size=1, max_size=6), label="key")] = 1
    elif target:
        key = data.draw(st.sampled_from(sorted(target)), label="field")
        if how == "drop":
            del target[key]
        else:
            edges = st.sampled_from(EDGE_NUMBERS + ([] if with_bytes else HUGE_INTS))
            edges |= st.just(LONE_SURROGATE)
            target[key] = data.draw(st.one_of(edges, values(with_bytes)), label="junk")
    return out


def _encode(body: Any, ctype: str) -> tuple[bytes, str]:
    """The body in ``ctype``, or in JSON when msgpack cannot carry it (a huge integer,
    a lone surrogate)."""
    if ctype == MP:
        try:
            return _mp(body), MP
        except (OverflowError, TypeError, ValueError):
            pass
    return json.dumps(body).encode(), JS


@settings(FUZZ, max_examples=600)
@given(data=st.data())
def test_every_route_answers_below_500_and_a_4xx_changes_nothing(
    world: World, data: st.DataObject
) -> None:
    # Given a route, a caller and a body: random, a valid one mutated, or raw bytes
    method, template = data.draw(st.sampled_from(sorted(VALID)), label="route")
    token = world.tokens[data.draw(st.sampled_from(["admin", "producer", "worker"]), label="who")]
    # (HTTP percent-decoding never yields a lone surrogate: none in paths)
    chars = st.characters(exclude_categories=["Cs"], exclude_characters="/?#")
    override = data.draw(st.one_of(st.none(), st.text(chars, max_size=20)), label="path parameter")
    path = _path(template, world.ids, override or None)
    ctype = data.draw(st.sampled_from([MP, JS]), label="content type")
    valid = VALID[(method, template)]
    shape = data.draw(st.sampled_from(["random", "mutated", "raw"]), label="shape")
    if shape == "raw":
        body = data.draw(st.binary(max_size=64), label="raw body")
    elif shape == "mutated" and valid:
        body, ctype = _encode(_mutate(_fill(valid, world.ids), data, ctype == MP), ctype)
    else:
        body, ctype = _encode(data.draw(maps(with_bytes=ctype == MP), label="random body"), ctype)
    query = data.draw(
        st.dictionaries(st.sampled_from(QUERY_KEYS), st.text(max_size=8), max_size=3),
        label="query",
    )
    if method == "GET" and template == "/v1/invocations" and data.draw(st.booleans()):
        query.setdefault("queue", "team-a")
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    before = snapshot(world.plane)
    # When it is sent
    reply = send(world, method, path, body, ctype, token, qs)
    # Then the answer is below 500, and a 4xx left the store as it was
    check_answer(world, before, reply)


@pytest.mark.parametrize(
    ("method", "template"), sorted(VALID), ids=[f"{m} {p}" for m, p in sorted(VALID)]
)
def test_every_valid_body_is_accepted(world: World, method: str, template: str) -> None:
    """The bodies the fuzzer mutates are valid, so a mutation probes one fault at a time."""
    valid = VALID[(method, template)]
    path = _path(template, world.ids, None)
    body = b"" if valid is None else _mp(_fill(valid, world.ids))
    ctype = MP
    if method == "PUT":
        body, ctype = b"new blob", "application/octet-stream"
        path = f"/v1/blobs/{hashlib.sha256(body).hexdigest()}"
    query = {"/v1/invocations": "queue=team-a", "/v1/queues/{name}": "force=true"}
    reply = send(world, method, path, body, ctype, world.tokens["admin"], query.get(template, ""))
    assert reply.status < 300, reply.body


BODY_ROUTES = sorted(k for k, v in VALID.items() if v is not None)


@pytest.mark.parametrize(
    ("method", "template"), BODY_ROUTES, ids=[f"{m} {p}" for m, p in BODY_ROUTES]
)
@pytest.mark.parametrize(
    ("body", "ctype", "status"),
    [
        pytest.param(b"[]", JS, 400, id="a list"),
        pytest.param(b'"x"', JS, 400, id="a string"),
        pytest.param(b"null", JS, 400, id="null"),
        pytest.param(b"\x93\x01\x02\x03", MP, 400, id="a msgpack array"),
        pytest.param(b"\x81\x01\x02", MP, 400, id="an integer key"),
        pytest.param(b"\x82\xa1a\x01", MP, 400, id="truncated msgpack"),
        pytest.param(b'{"a": 1', JS, 400, id="truncated json"),
        pytest.param(b"\xff\xfe{", JS, 400, id="not utf-8"),
        pytest.param(b"<a/>", "text/xml", 415, id="xml"),
        pytest.param(b"\x80" * (64 * 1024 + 1), MP, 413, id="over max_body"),
    ],
)
def test_malformed_and_wrong_type_bodies_are_4xx_on_every_route(
    world: World, method: str, template: str, body: bytes, ctype: str, status: int
) -> None:
    path = _path(template, world.ids, None)
    before = snapshot(world.plane)
    reply = send(world, method, path, body, ctype, world.tokens["admin"])
    assert reply.status == status, reply.body
    check_answer(world, before, reply)


#: bodies of the right JSON types whose values no float, SQLite column, msgpack int or
#: UTF-8 encoder takes (JSON's "\\ud800" escape decodes to a lone surrogate)
KNOWN_BAD: list[Any] = [
    pytest.param(
        "POST",
        "/v1/invocations",
        b'{"invocations": [{"queue": "q", "ref": "m:f", "args": ["\\ud800"]}]}',
        id="a lone surrogate in ref args",
    ),
    pytest.param(
        "POST",
        "/v1/invocations",
        b'{"invocations": [{"queue": "q", "id": "\\ud800", "ref": "m:f"}]}',
        id="a lone surrogate as invocation id",
    ),
    pytest.param(
        "POST", "/v1/daemons", b'{"name": "\\ud800"}', id="a lone surrogate as daemon name"
    ),
    pytest.param(
        "POST",
        "/v1/tokens",
        b'{"role": "worker", "name": "\\ud800"}',
        id="a lone surrogate as token name",
    ),
    pytest.param(
        "POST", "/v1/invocations/wait", b'{"ids": ["\\ud800"]}', id="a lone surrogate as id"
    ),
    pytest.param(
        "POST", "/v1/data/lookup", b'{"keys": ["\\ud800"]}', id="a lone surrogate as data key"
    ),
    pytest.param(
        "POST",
        "/v1/invocations",
        b'{"invocations": [{"queue": "q", "ref": "m:f", "priority": 1' + b"0" * 400 + b"}]}",
        id="priority of 10**400",
    ),
    pytest.param(
        "POST",
        "/v1/invocations",
        b'{"invocations": [{"queue": "q", "ref": "m:f", "max_attempts": 1' + b"0" * 30 + b"}]}",
        id="max_attempts of 10**30",
    ),
    pytest.param(
        "POST",
        "/v1/invocations",
        b'{"invocations": [{"queue": "q", "ref": "m:f", "delay": 1e308}]}',
        id="delay of 1e308",
    ),
    pytest.param(
        "POST",
        "/v1/invocations",
        b'{"invocations": [{"queue": "q", "ref": "m:f", "timeout": 1' + b"0" * 400 + b"}]}",
        id="timeout of 10**400",
    ),
    pytest.param(
        "POST",
        "/v1/invocations",
        json.dumps(
            {
                "invocations": [
                    {"queue": "q", "payload": base64.b64encode(_mp({"v": 1, "kind": [1]})).decode()}
                ]
            }
        ).encode(),
        id="payload kind is a list",
    ),
    pytest.param(
        "POST",
        "/v1/invocations/wait",
        b'{"ids": ["p"], "timeout": 1' + b"0" * 400 + b"}",
        id="wait timeout of 10**400",
    ),
    pytest.param(
        "POST",
        "/v1/queues/prune",
        b'{"older_than": 1' + b"0" * 400 + b"}",
        id="prune older_than of 10**400",
    ),
    pytest.param(
        "PATCH",
        "/v1/invocations/p",
        b'{"priority": 1' + b"0" * 400 + b"}",
        id="re-prioritise to 10**400",
    ),
    pytest.param(
        "POST",
        "/v1/queues",
        b'{"name": "q", "retry": {"max": 1' + b"0" * 30 + b"}}",
        id="queue retry.max of 10**30",
    ),
    pytest.param(
        "POST",
        "/v1/daemons",
        b'{"name": "d", "pickle_protocols": [{"a": 1}]}',
        id="daemon pickle_protocols of maps",
    ),
    pytest.param(
        "POST",
        "/v1/queues",
        b'{"name": "team-a", "check": ["name"]}',
        id="check of an existing queue names 'name'",
    ),
    pytest.param(
        "POST",
        "/v1/daemons",
        b'{"name": "d", "concurrency": 1' + b"0" * 30 + b"}",
        id="daemon concurrency of 10**30",
    ),
    pytest.param(
        "POST",
        "/v1/claims",
        b'{"queues": ["team-a"], "worker": "w", "limit": 1, "wait": 1' + b"0" * 400 + b"}",
        id="claim wait of 10**400",
    ),
    pytest.param(
        "POST",
        "/v1/progress",
        b'{"id": "r", "lease_token": "x", "fraction": 1' + b"0" * 400 + b"}",
        id="progress fraction of 10**400",
    ),
]


@pytest.mark.parametrize(("method", "path", "body"), KNOWN_BAD)
def test_values_no_store_can_hold_are_4xx_and_change_nothing(
    world: World, method: str, path: str, body: bytes
) -> None:
    # Given a body whose fields have the right JSON types but values nothing can hold
    before = snapshot(world.plane)
    # When the admin sends it
    reply = send(world, method, path, body, JS, world.tokens["admin"])
    # Then it is refused with a reason, and nothing stored changed (no queue made first)
    assert 400 <= reply.status < 500, reply.body
    check_answer(world, before, reply)


#: bodies naming a queue no queue can be called, a retry no retry can follow, or more
#: job slots than a daemon may have
BAD_NAMES_AND_RETRIES: list[Any] = [
    pytest.param(
        "POST", "/v1/claims", {"queues": ["bad/name"], "worker": "w"}, "queue name", id="claim"
    ),
    pytest.param(
        "POST",
        "/v1/daemons",
        {"name": "d3", "queues": ["bad/name"]},
        "queue name",
        id="register a daemon",
    ),
    pytest.param(
        "PATCH",
        "/v1/daemons/{daemon}",
        {"add_queues": ["bad/name"]},
        "queue name",
        id="add a queue to a daemon",
    ),
    pytest.param(
        "PATCH",
        "/v1/queues/{name}",
        {"temperature": 0.3},
        "temperature applies to boltzmann queues, not fifo ones",
        id="a fifo queue's temperature",
    ),
    pytest.param(
        "POST",
        "/v1/invocations/{pending}/cancel",
        {"reason": "x"},
        "this route takes no body (given: reason)",
        id="a cancel with a field",
    ),
    pytest.param(
        "POST",
        "/v1/invocations/{failed}/retry",
        {"now": True},
        "this route takes no body",
        id="a retry with a field",
    ),
    pytest.param(
        "POST",
        "/v1/daemons/{daemon}/drain",
        {"force": True},
        "this route takes no body",
        id="a drain with a field",
    ),
    pytest.param(
        "PATCH",
        "/v1/daemons/{daemon}",
        {"concurrency": 100_000},
        "concurrency must be 1 to 10000",
        id="a daemon's concurrency past the most",
    ),
    pytest.param(
        "POST",
        "/v1/queues",
        {"name": "team-a-2", "retry": {"backoff": -1}},
        "retry.backoff",
        id="a queue's retry backoff below 0",
    ),
    pytest.param(
        "POST",
        "/v1/invocations",
        {"invocations": [{"queue": "team-a", "ref": "m:f", "retry": {"max_backoff": -5}}]},
        "retry.max_backoff",
        id="a call's retry max_backoff below 0",
    ),
    pytest.param(
        "POST",
        "/v1/queues",
        {"name": "team-a-3", "retry": {"max": -1}},
        "retry.max",
        id="a queue's retry max below 0",
    ),
]


@pytest.mark.parametrize(("method", "template", "body", "named"), BAD_NAMES_AND_RETRIES)
def test_bad_queue_names_retries_and_concurrency_are_400_wherever_they_come(
    world: World, method: str, template: str, body: Any, named: str
) -> None:
    # Given a body naming a queue that cannot exist, or a backoff no retry can wait
    before = snapshot(world.plane)
    # When the admin sends it
    reply = send(
        world, method, _path(template, world.ids, None), _mp(body), MP, world.tokens["admin"]
    )
    # Then it is refused with a reason naming the field, and nothing stored changed
    assert reply.status == 400, reply.body
    assert named in reply.body["error"]["message"]
    check_answer(world, before, reply)


def test_bodiless_routes_take_an_empty_map_and_logs_refuse_a_negative_cursor(
    world: World,
) -> None:
    # Given a cancel sent with an empty map (what clients send by habit)
    cancel = _path("/v1/invocations/{pending}/cancel", world.ids, None)
    reply = send(world, "POST", cancel, _mp({}), MP, world.tokens["admin"])
    # Then it is taken
    assert (reply.status, reply.body["state"]) == (200, "cancelled")
    # and a logs cursor below zero is refused with a reason
    logs = _path("/v1/invocations/{running}/logs", world.ids, None)
    before = snapshot(world.plane)
    reply = send(world, "GET", logs, b"", MP, world.tokens["admin"], "after=-1")
    assert reply.status == 400 and "after must be" in reply.body["error"]["message"]
    check_answer(world, before, reply)


def test_a_refused_submit_creates_no_queue(world: World) -> None:
    # Given an id the plane has (in team-a), replayed with another body on a new queue
    body = b'{"invocations": [{"id": "p", "queue": "team-a-new", "ref": "m:f"}]}'
    before = snapshot(world.plane)
    # When it is submitted
    reply = send(world, "POST", "/v1/invocations", body, JS, world.tokens["admin"])
    # Then it is a 409, and the queue it named was not made on the way
    assert (reply.status, reply.body["error"]["code"]) == (409, "idempotency_conflict")
    check_answer(world, before, reply)
