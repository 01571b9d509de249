"""Wake objects: an idle worker on the AWS plane watches S3 instead of asking the API.

The plane over the DynamoDB + S3 store (a moto server, the template's tables and
bucket) answers an empty claim at once with what to watch; a submit to an idle queue
rewrites its wake object; the HTTP transport GETs the objects with ``If-None-Match``
between claims and claims again when one changed, its URL stopped working, or the
fallback passed. Requests are counted with botocore event hooks (S3) and at the API
handler (claims). SQLite planes (serve, embedded) are unchanged: no ``wake``, claims
held as before.
"""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from openapi_schema_validator import OAS31Validator

from dreamlake.lakeshore.api import Service, bootstrap_admin
from dreamlake.lakeshore.api.auth import Identity
from dreamlake.lakeshore.api.service import Limits
from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.handlers.api import make_app
from dreamlake.lakeshore.http.connections import Answer
from dreamlake.lakeshore.http.transport import HttpTransport
from dreamlake.lakeshore.http.wake import FIRST_LOOK, WakeWatch
from dreamlake.lakeshore.plane import Plane, QueueSpec, RetryPolicy, State, Submission
from dreamlake.lakeshore.plane.store import wake_objects
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.stores import keys as K
from dreamlake.lakeshore.submit import new_id
from dreamlake.lakeshore.wire import encode_ref_call, encode_result

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
INTERVAL = 0.2
FALLBACK = 1.5


class CountingTransport(HttpTransport):
    """The SDK's transport with the API served in this process by the Lambda handler's
    router (API Gateway v2 events, as the function gets them); everything else (the
    presigned S3 URLs) goes over the network to the moto server."""

    def __init__(self, app: Any, token: str, api_calls: Counter[str]) -> None:
        super().__init__("https://api.local", token, retries=0)
        self.app = app
        self.api_calls = api_calls
        self.answers: list[Any] = []

    def _exchange(
        self, method: str, target: Any, body: bytes | None, headers: Any, timeout: float
    ) -> Any:
        if not target.own:
            return super()._exchange(method, target, body, headers, timeout)
        path, _, query = target.path.partition("?")
        self.api_calls[f"{method} {path}"] += 1
        event = apigw.http_event(method, path, query_string=query, headers=headers, body=body)
        status, pairs, answer = apigw.http_response(self.app.resolve(event, cast(Any, None)))
        return Answer(status, {k.lower(): v for k, v in pairs}, answer)


@dataclass
class Stack:
    plane: Plane
    service: Service
    app: Any
    token: str
    s3_calls: Counter[str]
    api_calls: Counter[str]
    #: the DynamoDB and S3 clients the plane's store uses
    clients: tuple[Any, Any]

    def transport(self) -> CountingTransport:
        return CountingTransport(self.app, self.token, self.api_calls)

    def claims(self) -> int:
        return self.api_calls["POST /v1/claims"]

    def wake_puts(self) -> int:
        return self.s3_calls["PutObject wake/"]


@pytest.fixture(scope="module")
def moto_clients() -> Iterator[tuple[Any, Any]]:
    import boto3

    from dreamlake.lakeshore.awsdirect import LOCAL_CREDENTIALS
    from dreamlake.lakeshore.devstack import _reset_moto, moto_server
    from dreamlake.lakeshore.stores.dynamo import make_clients

    server = moto_server(0)
    server.start()
    host, port = server.get_host_and_port()
    try:
        session = boto3.Session(region_name="us-east-1", **LOCAL_CREDENTIALS)
        yield make_clients("us-east-1", f"http://{host}:{port}", session=session)
    finally:
        # moto's account is the process's: leave it empty for the next test that
        # counts what is in it (test_dev's), whatever the order
        _reset_moto(f"http://{host}:{port}")
        server.stop()


@pytest.fixture
def stack(moto_clients: tuple[Any, Any]) -> Iterator[Stack]:
    from dreamlake.lakeshore.infra.tables import build_stack
    from dreamlake.lakeshore.server import thread_safe
    from dreamlake.lakeshore.stores.dynamo import DynamoStore

    ddb, s3 = moto_clients
    resources = K.Resources(
        queues=f"q-{new_id()}",
        invocations=f"i-{new_id()}",
        records=f"r-{new_id()}",
        logs=f"l-{new_id()}",
        bucket=f"b-{new_id()}".lower()[:60],
    )
    build_stack(ddb, s3, resources, "us-east-1")
    s3_calls: Counter[str] = Counter()

    def count(params: dict[str, Any], model: Any, **_: Any) -> None:
        key = str(params.get("Key", ""))
        s3_calls[f"{model.name} {key.split('/', 1)[0]}/"] += 1

    s3.meta.events.register("before-parameter-build.s3", count)
    plane = Plane(DynamoStore(resources, dynamodb=ddb, s3=s3))
    token = bootstrap_admin(plane)
    assert token is not None
    limits = Limits(max_wait=2.0, wake_interval=INTERVAL, wake_fallback=FALLBACK)
    service = Service(plane, limits=limits)
    try:
        app = thread_safe(make_app(service))
        yield Stack(plane, service, app, token, s3_calls, Counter(), (ddb, s3))
    finally:
        s3.meta.events.unregister("before-parameter-build.s3", count)
        plane.close()


def job(queue: str, **options: Any) -> Submission:
    return Submission(new_id(), queue, encode_ref_call("math:sqrt", (4.0,), {}).payload, **options)


class Looks:
    """The worker's conditional GETs of its wake objects, counted as they are made."""

    def __init__(self, t: HttpTransport) -> None:
        self.cond = threading.Condition()
        self.n = 0
        status = t._wake_status

        def counted(url: str, etag: str) -> int:
            answer = status(url, etag)
            with self.cond:
                self.n += 1
                self.cond.notify_all()
            return answer

        t._wake_status = counted  # type: ignore[method-assign]

    def reach(self, n: int) -> bool:
        """Wait until ``n`` looks were made (False after 10 s)."""
        with self.cond:
            return self.cond.wait_for(lambda: self.n >= n, timeout=10)


def unannounced(stack: Stack, sub: Submission) -> None:
    """Write ``sub`` as a writer that knows nothing of wake objects would (a plane on
    the same tables without the capability): the idle mark stays, no object changes."""
    from dreamlake.lakeshore.stores.dynamo import DynamoStore

    class NoWake(DynamoStore):
        queue_and_idle = mark_idle = wake = wake_url = None  # type: ignore[assignment]

    ddb, s3 = stack.clients
    other = Plane(NoWake(cast(DynamoStore, stack.plane.store).resources, dynamodb=ddb, s3=s3))
    try:
        other.submit([sub])
    finally:
        other.close()  # (the clients are the stack's: left open)


def claim_in_thread(
    t: HttpTransport, queue: str, wait: float
) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []

    def run() -> None:
        got.append(t.claim([queue], "w", wait=wait))

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


# --- the answer ----------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_an_empty_claim_answers_at_once_with_wake_urls_valid_by_the_spec(stack: Stack) -> None:
    stack.plane.ensure_queue(QueueSpec("w1"))
    admin = Identity("admin", "admin", ("*",))
    # (not held, although it may wait a minute: the test's timeout ends a held claim)
    stack.service.limits = replace(stack.service.limits, max_wait=60.0)
    answer = stack.service.claim(admin, {"queues": ["w1"], "worker": "w", "wait": 60.0})
    assert answer["claims"] == []
    wake = answer["wake"]
    assert set(wake["urls"]) == set(wake["etags"]) == {"w1"}
    assert f"/{K.wake_key('w1')}?" in wake["urls"]["w1"]
    assert wake["interval"] == INTERVAL and wake["fallback"] == FALLBACK
    spec = yaml.safe_load((ROOT / "infra" / "openapi.yaml").read_text())
    schema = {"$ref": "#/components/schemas/ClaimAnswer", "components": spec["components"]}
    assert not list(OAS31Validator(schema).iter_errors(answer))
    # the second empty claim finds the mark set: the same object, no new PUT
    puts = stack.wake_puts()
    again = stack.service.claim(admin, {"queues": ["w1"], "worker": "w"})
    assert again["wake"]["etags"] == wake["etags"]
    assert stack.wake_puts() == puts


# --- submits -------------------------------------------------------------------------------


def test_a_submit_to_an_idle_queue_wakes_it_once_and_a_busy_queue_pays_nothing(
    stack: Stack,
) -> None:
    t = stack.transport()
    t.ensure_queue(QueueSpec("busy"))
    before = stack.wake_puts()
    for _ in range(3):  # busy: every claim finds work
        t.submit([job("busy"), job("busy")])
        assert len(t.claim(["busy"], "w", limit=2)) == 2
    assert stack.wake_puts() == before
    assert t.claim(["busy"], "w") == []  # now idle: marked, object written once
    marked = stack.wake_puts()
    assert marked == before + 1
    t.submit([job("busy")])  # the first submit wakes
    assert stack.wake_puts() == marked + 1
    t.submit([job("busy")])  # the mark is gone: no more PUTs
    t.submit([job("busy"), job("busy")])
    assert stack.wake_puts() == marked + 1


def test_a_retry_on_an_idle_queue_wakes_it_as_a_submit_does(stack: Stack) -> None:
    # Given a call that failed for good on a queue whose workers have since gone idle
    t = stack.transport()
    t.ensure_queue(QueueSpec("again"))
    (inv_id,) = t.submit([job("again")])
    (claim,) = t.claim(["again"], "w")
    error = {"type": "builtins.ValueError", "message": "no", "traceback": ""}
    t.fail(claim.id, claim.lease_token, error, retryable=False)
    assert t.claim(["again"], "w") == []  # idle: marked, its object written
    marked = stack.wake_puts()
    # When it is retried, then the idle queue's object is rewritten once (its watchers
    # claim at once, not at their fallback)
    assert t.retry(inv_id).state is State.PENDING
    assert stack.wake_puts() == marked + 1


def test_work_made_claimable_by_the_plane_itself_wakes_an_idle_queue(stack: Stack) -> None:
    """The rule is the plane's, not the API's: a submit made on the plane (as the
    ``aws://`` transport makes it, from a Lambda or a notebook), a call handed back,
    a lease the sweep hands on, each rewrites an idle queue's object once."""
    # Given a queue whose HTTP workers have gone idle
    t = stack.transport()
    t.ensure_queue(QueueSpec("direct"))
    assert t.claim(["direct"], "w") == []
    marked = stack.wake_puts()
    # When work is submitted on the plane, then the object is rewritten; a second
    # submit, the queue no longer marked, writes nothing
    stack.plane.submit([job("direct")])
    assert stack.wake_puts() == marked + 1
    stack.plane.submit([job("direct")])
    assert stack.wake_puts() == marked + 1
    # When a worker hands a call back while the queue's other workers are idle
    first, second = t.claim(["direct"], "w", limit=2)
    assert t.claim(["direct"], "w") == []  # idle again: marked
    marked = stack.wake_puts()
    stack.plane.release(first.id, first.lease_token)
    assert stack.wake_puts() == marked + 1
    # When a worker is lost, then the sweep that hands its call on wakes the queue too
    (again,) = t.claim(["direct"], "w")
    assert again.id == first.id
    assert t.claim(["direct"], "w") == []  # idle: marked
    marked = stack.wake_puts()
    later = FakeClock(stack.plane.now() + 3600)  # (both leases long run out)
    swept = Plane(stack.plane.store, clock=later)
    assert swept.sweep() == 2
    assert stack.wake_puts() == marked + 1  # one queue, one rewrite
    assert {c.id for c in t.claim(["direct"], "w", limit=2)} == {first.id, second.id}


def test_resuming_a_paused_queue_wakes_its_idle_workers(stack: Stack) -> None:
    t = stack.transport()
    t.ensure_queue(QueueSpec("held"))
    admin = Identity("admin", "admin", ("*",))
    stack.service.update_queue(admin, "held", {"paused": True})
    t.submit([job("held")])
    assert t.claim(["held"], "w") == []  # paused: nothing handed out, the worker idle
    marked = stack.wake_puts()
    stack.service.update_queue(admin, "held", {"paused": False})
    assert stack.wake_puts() == marked + 1
    assert len(t.claim(["held"], "w")) == 1


def test_an_idle_worker_picks_a_submitted_job_within_the_interval(stack: Stack) -> None:
    worker, producer = stack.transport(), stack.transport()
    worker.ensure_queue(QueueSpec("idle"))
    # (its claim may wait 30 s, and the fallback is later: only a wake ends it sooner)
    stack.service.limits = replace(stack.service.limits, wake_fallback=60.0)
    assert worker.claim(["idle"], "w", wait=0.0) == []  # idle: the watch starts
    claims_before = stack.claims()
    gets_before = stack.s3_calls["GetObject wake/"]  # the store's own reads: none
    looks = Looks(worker)
    thread, got = claim_in_thread(worker, "idle", wait=30.0)
    assert looks.reach(3)  # three looks at its object
    assert stack.claims() == claims_before  # watching S3, not asking the API
    producer.submit([job("idle")])
    seen = looks.n  # (the plane has it: its object changed)
    thread.join(20)
    (claims,) = got
    assert len(claims) == 1 and claims[0].queue == "idle"
    assert looks.n <= seen + 2  # found at the next look (or the one under way, and it)
    assert stack.claims() == claims_before + 1
    assert stack.s3_calls["GetObject wake/"] == gets_before


def test_a_worker_gone_idle_looks_soon_then_ever_less_often_up_to_the_interval() -> None:
    answer = {"urls": {"q": "https://s3/wake/q"}, "etags": {"q": '"e"'}, "interval": 4.5}
    watch = WakeWatch.from_answer({**answer, "fallback": 120.0}, 100.0)
    assert watch is not None
    assert watch.next_look == pytest.approx(100.0 + FIRST_LOOK)
    paces = []
    for _ in range(8):
        before = time.monotonic()
        assert not watch.look(lambda url, etag: 304)
        paces.append(watch.next_look - before)  # (the look's own time is ~0)
    for pace, expected in zip(paces, [0.2, 0.4, 0.8, 1.6, 3.2, 4.5, 4.5, 4.5], strict=True):
        assert expected <= pace < expected + 0.1
    # a plane's interval shorter than the first look is kept
    short = WakeWatch.from_answer({**answer, "interval": 0.06, "fallback": 1.0}, 0.0)
    assert short is not None and short.next_look == pytest.approx(0.06)
    # a worker idle all along (its empty claim at the fallback) keeps the steady pace
    steady = WakeWatch.from_answer({**answer, "fallback": 120.0}, 100.0, soon=False)
    assert steady is not None and steady.next_look == pytest.approx(104.5)
    steady.look(lambda url, etag: 304)
    assert steady.pace == 4.5


def test_the_fallback_claim_of_a_worker_idle_all_along_keeps_the_steady_pace(
    stack: Stack,
) -> None:
    worker = stack.transport()
    worker.ensure_queue(QueueSpec("calm"))
    assert worker.claim(["calm"], "w", wait=0.0) == []  # gone idle: looks soon
    assert worker._wakes[("calm",)].next_look - time.monotonic() <= FIRST_LOOK
    worker._wakes[("calm",)].claim_at = 0.0  # its fallback has come
    before = time.monotonic()
    assert worker.claim(["calm"], "w", wait=0.0) == []
    # the watch renewed at the plane's pace: the next look an interval away
    assert worker._wakes[("calm",)].next_look - before >= INTERVAL


def test_a_job_submitted_as_its_worker_goes_idle_is_picked_up_well_within_the_interval(
    stack: Stack,
) -> None:
    # Given a plane whose idle workers look at their wake objects every 30 s
    stack.service.limits = replace(stack.service.limits, wake_interval=30.0, wake_fallback=60.0)
    worker, producer = stack.transport(), stack.transport()
    worker.ensure_queue(QueueSpec("next"))
    assert worker.claim(["next"], "w", wait=0.0) == []  # its last job done: idle
    looks = Looks(worker)
    thread, got = claim_in_thread(worker, "next", wait=45.0)
    # When a producer submits its next call at once (one call after another)
    producer.submit([job("next")])
    seen = looks.n
    thread.join(20)
    # Then the worker has it at one of its first looks (0.1 s, then 0.2, 0.4...), not an
    # interval later (its claim would still be waiting)
    (claims,) = got
    assert len(claims) == 1
    assert looks.n <= seen + 2


def test_a_delayed_job_on_an_idle_queue_is_claimed_when_due_before_the_fallback(
    stack: Stack,
) -> None:
    # (a fallback later than the claim's wait: only the due time ends the wait sooner)
    stack.service.limits = replace(stack.service.limits, wake_fallback=60.0)
    worker, producer = stack.transport(), stack.transport()
    worker.ensure_queue(QueueSpec("later"))
    assert worker.claim(["later"], "w", wait=0.0) == []
    # (the delay counts from when the plane took the submit, after this mark)
    before = time.monotonic()
    producer.submit([job("later", delay=0.6)])
    claims = worker.claim(["later"], "w", wait=30.0)
    assert len(claims) == 1
    assert time.monotonic() - before >= 0.5  # (not before it was due)


# --- fallbacks -----------------------------------------------------------------------------


class Forbidding(http.server.BaseHTTPRequestHandler):
    """An S3 stand-in whose URLs have all expired."""

    hits = 0

    def do_GET(self) -> None:
        Forbidding.hits += 1
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_url_answering_403_means_claim_now(stack: Stack) -> None:
    worker, producer = stack.transport(), stack.transport()
    worker.ensure_queue(QueueSpec("expired"))
    assert worker.claim(["expired"], "w", wait=0.0) == []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forbidding)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        watch = worker._wakes[("expired",)]
        _, etag = watch.objects["expired"]
        watch.objects["expired"] = (f"http://127.0.0.1:{server.server_port}/wake/x", etag)
        # work the wake object does not announce
        unannounced(stack, job("expired"))
        claims_before, hits = stack.claims(), Forbidding.hits
        claims = worker.claim(["expired"], "w", wait=FALLBACK - 0.3)
        assert len(claims) == 1  # the 403 sent it to the plane at the first look
        assert Forbidding.hits == hits + 1
        assert stack.claims() == claims_before + 1
    finally:
        server.shutdown()
        server.server_close()
    assert producer is not None


def test_work_no_submit_announced_is_claimed_at_the_fallback(stack: Stack) -> None:
    """The process worker's loop (short claims, a stop flag): between fallbacks only
    S3 looks; a job no wake announced waits for the fallback."""
    worker = stack.transport()
    worker.ensure_queue(QueueSpec("quiet"))
    stop = threading.Event()
    assert worker.claim(["quiet"], "w", wait=0.0) == []
    started = time.monotonic()
    claims_before = stack.claims()
    unannounced(stack, job("quiet"))  # the mark stays
    got: list[Any] = []
    while not got and time.monotonic() - started < 30:
        got = worker.claim(["quiet"], "w", wait=0.3, should_stop=stop.is_set)
    assert len(got) == 1
    assert time.monotonic() - started >= FALLBACK - 0.1  # (not before the fallback)
    assert stack.claims() == claims_before + 1  # one claim: the fallback's


@pytest.mark.timeout(30)
def test_an_empty_fallback_claim_renews_the_watch_and_stop_is_seen(stack: Stack) -> None:
    worker = stack.transport()
    worker.ensure_queue(QueueSpec("still"))
    assert worker.claim(["still"], "w", wait=0.0) == []
    before = stack.claims()
    assert worker.claim(["still"], "w", wait=FALLBACK + 0.5) == []
    assert stack.claims() == before + 1  # the fallback's claim, answered with a new watch
    assert ("still",) in worker._wakes
    stop = threading.Event()
    stop.set()  # (a claim that did not see it would wait a minute: the test's timeout)
    before = stack.claims()
    assert worker.claim(["still"], "w", wait=60.0, should_stop=stop.is_set) == []
    assert stack.claims() == before  # (not even the fallback's)


# --- planes without wake objects ---------------------------------------------------------------


@pytest.mark.timeout(30)
def test_sqlite_planes_have_no_wake_and_still_hold_claims() -> None:
    plane = Plane(SqliteStore(":memory:"))
    try:
        assert wake_objects(plane.store) is None
        service = Service(plane, limits=Limits(max_wait=1.0))
        admin = Identity("admin", "admin", ("*",))
        plane.ensure_queue(QueueSpec("s"))
        started = time.monotonic()
        answer = service.claim(admin, {"queues": ["s"], "worker": "w", "wait": 0.4})
        assert answer == {"claims": []}
        assert time.monotonic() - started >= 0.39  # held, as before
        # (a claim that may wait a minute, woken by the submit)
        service.limits = Limits(max_wait=60.0)
        timer = threading.Timer(0.2, lambda: plane.submit([job("s")]))
        timer.start()
        answer = service.claim(admin, {"queues": ["s"], "worker": "w", "wait": 60.0})
        assert len(answer["claims"]) == 1 and "wake" not in answer
        assert "wake" not in service.submit(admin, {"invocations": [{"queue": "s", "ref": "m:f"}]})
    finally:
        plane.close()


def test_a_worker_watching_before_its_queue_exists_is_woken_by_the_creating_submit(
    stack: Stack,
) -> None:
    worker, producer = stack.transport(), stack.transport()
    assert worker.claim(["fresh"], "w", wait=0.0) == []  # no such queue: nothing marked
    watch = worker._wakes[("fresh",)]
    assert watch.claim_at - time.monotonic() <= 4 * INTERVAL  # claims again sooner
    watch.claim_at = time.monotonic() + 600  # (here: only its object may send it)
    looks = Looks(worker)
    claims_before = stack.claims()
    thread, got = claim_in_thread(worker, "fresh", wait=30.0)
    assert looks.reach(3)  # it is watching an object (not claiming at a 404)
    assert stack.claims() == claims_before
    puts = stack.wake_puts()
    producer.submit([job("fresh")])  # creates the queue, and rewrites its object
    assert stack.wake_puts() == puts + 1
    seen = looks.n
    thread.join(20)
    (claims,) = got
    assert len(claims) == 1
    assert looks.n <= seen + 2  # at the next look


def test_a_failure_its_policy_retries_and_a_changed_queue_wake_an_idle_queue(
    stack: Stack,
) -> None:
    t = stack.transport()
    t.ensure_queue(QueueSpec("flaky"))
    (inv_id,) = t.submit([job("flaky", retry=RetryPolicy(max=2, backoff=0.5))])
    (claim,) = t.claim(["flaky"], "w")
    assert t.claim(["flaky"], "w") == []  # the queue's other workers: idle, marked
    marked = stack.wake_puts()
    # When the call fails and its policy retries it, then its queue is woken
    error = {"type": "builtins.ValueError", "message": "once", "traceback": ""}
    t.fail(claim.id, claim.lease_token, error, retryable=True)
    assert stack.plane.get(inv_id).state is State.PENDING
    assert stack.wake_puts() == marked + 1
    # When a queue whose workers are idle gets new settings, then it is woken too
    assert t.claim(["flaky"], "w") == []  # (its retry not due yet: idle again)
    marked = stack.wake_puts()
    stack.plane.update_queue("flaky", elasticity={"kind": "fixed", "max": 4})
    assert stack.wake_puts() == marked + 1


def test_a_wake_that_fails_loses_nothing_and_is_tried_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from dreamlake.lakeshore.stores.dynamo import DynamoStore

    t = stack.transport()
    t.ensure_queue(QueueSpec("shaky"))
    assert t.claim(["shaky"], "w") == []  # idle: marked
    store = cast(DynamoStore, stack.plane.store)
    put = store._put_wake

    def failing(name: str) -> str:
        raise RuntimeError("S3 is away")

    # When a submit's wake fails (S3 away), then the submit stands, the failure is
    # logged, and the queue stays marked
    monkeypatch.setattr(store, "_put_wake", failing)
    with caplog.at_level(logging.WARNING, logger="dreamlake.lakeshore.plane"):
        (first,) = stack.plane.submit([job("shaky")])
    assert stack.plane.get(first).state is State.PENDING
    assert any("waking idle queue 'shaky' failed" in r.getMessage() for r in caplog.records)
    assert store.queue_and_idle("shaky") == (store.get_queue("shaky"), True)
    # When S3 is back, then the next submit wakes it
    monkeypatch.setattr(store, "_put_wake", put)
    before = stack.wake_puts()
    stack.plane.submit([job("shaky")])
    assert stack.wake_puts() == before + 1
    assert len(t.claim(["shaky"], "w", limit=2)) == 2


def test_a_claim_answers_its_leases_when_reading_the_pauses_fails(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pauses are read after the claim leased its calls: a failed read answers them
    (leased to this worker) instead of failing a request whose leases would then stand
    until they run out."""
    admin = Identity("admin", "admin", ("*",))
    t = stack.transport()
    t.ensure_queue(QueueSpec("flagged"))
    (inv_id,) = t.submit([job("flagged")])

    real = stack.service.pauses.paused
    reads: list[object] = []

    def unreadable(*args: Any, **kw: Any) -> set[str]:  # (the read after the lease fails)
        reads.append(args)
        if len(reads) > 1:
            raise OSError("the flags' store is down")
        return real(*args, **kw)

    monkeypatch.setattr(stack.service.pauses, "paused", unreadable)
    answer = stack.service.claim(admin, {"queues": ["flagged"], "worker": "w"})
    (claim,) = answer["claims"]
    assert claim["id"] == inv_id
    assert stack.plane.get(inv_id).lease_token == claim["lease_token"]
    assert len(reads) == 2


def test_a_claim_made_on_a_resume_is_not_answered_from_a_cached_pause(stack: Stack) -> None:
    # Given two API processes over one plane (two Lambda instances), the worker's claims
    # going to one, the operator's requests to the other
    admin = Identity("admin", "admin", ("*",))
    other = Service(stack.plane, limits=stack.service.limits)
    t = stack.transport()
    t.ensure_queue(QueueSpec("gated"))
    other.update_queue(admin, "gated", {"paused": True})
    t.submit([job("gated")])
    assert t.claim(["gated"], "w") == []  # paused (and cached so where it claims)
    # When the other resumes it and the worker, woken, claims at once
    other.update_queue(admin, "gated", {"paused": False})
    # Then its claim is not answered from the pause cached where it lands
    assert len(t.claim(["gated"], "w")) == 1


def test_a_queue_made_before_its_first_submit_wakes_workers_watching_it(stack: Stack) -> None:
    """The SDK makes a queue (``PUT /v1/queues``, or the plane's ``ensure_queue`` over
    ``aws://``) before its first submit: workers watching its object since before it
    existed look again then, or they would wait out the claim of a missing queue."""
    worker, producer = stack.transport(), stack.transport()
    for name, make in (
        ("made-by-api", lambda n: producer.ensure_queue(QueueSpec(n))),
        ("made-on-plane", lambda n: stack.plane.ensure_queue(QueueSpec(n))),
    ):
        assert worker.claim([name], "w", wait=0.0) == []  # watching; no queue, no mark
        puts = stack.wake_puts()
        make(name)
        assert stack.wake_puts() == puts + 1
        # and its first submit, the queue not marked (nobody claimed since), writes nothing
        producer.submit([job(name)])
        assert stack.wake_puts() == puts + 1
        assert len(worker.claim([name], "w")) == 1


def test_a_finish_on_a_capped_queue_wakes_the_workers_the_cap_turned_away(stack: Stack) -> None:
    # Given a queue capped at one running call, two calls, one running and the queue's
    # other workers turned away by the cap (idle: marked, watching its object)
    t = stack.transport()
    t.ensure_queue(QueueSpec("capped", elasticity={"kind": "fixed", "max": 1}))
    t.submit([job("capped"), job("capped")])
    (first,) = t.claim(["capped"], "w1", limit=4)
    assert t.claim(["capped"], "w2", limit=4) == []  # the cap: nothing for now
    marked = stack.wake_puts()
    # When the running call finishes, then the queue's object is rewritten once, and
    # the turned-away worker takes the other call
    t.complete(first.id, first.lease_token, encode_result(1)[0])
    assert stack.wake_puts() == marked + 1
    (second,) = t.claim(["capped"], "w2", limit=4)
    # When a call is cancelled while it runs, that frees the slot too
    (third,) = t.submit([job("capped")])
    assert t.claim(["capped"], "w3", limit=4) == []  # capped again: marked
    marked = stack.wake_puts()
    assert t.cancel(second.id) is State.CANCELLED
    assert stack.wake_puts() == marked + 1
    assert [c.id for c in t.claim(["capped"], "w3")] == [third]


def test_finishes_on_a_queue_without_a_cap_write_nothing_extra(stack: Stack) -> None:
    t = stack.transport()
    t.ensure_queue(QueueSpec("free"))
    (inv_id,) = t.submit([job("free")])
    (claim,) = t.claim(["free"], "w")
    assert t.claim(["free"], "w2") == []  # idle: marked
    marked = stack.wake_puts()
    t.complete(claim.id, claim.lease_token, encode_result(1)[0])
    assert stack.plane.get(inv_id).state is State.SUCCEEDED
    assert stack.wake_puts() == marked  # no slot to free: the watchers keep watching


@pytest.mark.parametrize("made", ["by the submit", "first, by its own request"])
def test_a_claim_between_a_submits_read_and_its_write_is_woken_after_the_write(
    stack: Stack, made: str
) -> None:
    """A worker that claims between a submit's read of the idle mark and its write finds
    nothing, marks the queue idle and looks once more, still before the write: the
    submit read the queue unmarked, so its first look woke no one. The plane reads the
    mark again after the write. Both orders: the submit making its queue (which woke the
    queue's watchers before the records existed), and the SDK's, which makes the queue
    with a request of its own first (a worker stranded there waited out its fallback)."""
    admin = Identity("admin", "admin", ("*",))
    producer = stack.transport()
    if made.startswith("first"):
        producer.ensure_queue(QueueSpec("raced"))
    store: Any = stack.plane.store
    original = store.insert_many
    seen: list[str] = []

    def racing(invs: Any) -> Any:  # the woken worker claims between the read and the write
        answer = stack.service.claim(admin, {"queues": ["raced"], "worker": "w"})
        assert answer["claims"] == []
        seen.append(answer["wake"]["etags"]["raced"])
        return original(invs)

    ddb, s3 = stack.clients
    reads: list[bool] = []  # (moto is always consistent: the read after the write must ask)

    def note(params: dict[str, Any], **_: Any) -> None:
        if params.get("TableName") == store.resources.queues:
            reads.append(bool(params.get("ConsistentRead")))

    store.insert_many = racing
    ddb.meta.events.register("provide-client-params.dynamodb.GetItem", note)
    try:
        producer.submit([job("raced")])
    finally:
        store.insert_many = original
        ddb.meta.events.unregister("provide-client-params.dynamodb.GetItem", note)
    assert reads and reads[-1] is True
    head = s3.head_object(Bucket=store.resources.bucket, Key=K.wake_key("raced"))
    assert head["ETag"] != seen[0]  # rewritten after the write: the worker looks now
    assert len(producer.claim(["raced"], "w")) == 1


def test_a_cap_set_on_this_plane_wakes_on_the_next_finish(stack: Stack) -> None:
    t = stack.transport()
    t.ensure_queue(QueueSpec("late"))
    t.submit([job("late")])
    (c,) = t.claim(["late"], "w0")
    t.complete(c.id, c.lease_token, encode_result(1)[0])  # read: no cap (kept 5 s)
    stack.plane.update_queue("late", elasticity={"kind": "fixed", "max": 1})
    t.submit([job("late"), job("late")])
    (first,) = t.claim(["late"], "w1", limit=4)
    assert t.claim(["late"], "w2", limit=4) == []  # the new cap turns it away: marked
    marked = stack.wake_puts()
    t.complete(first.id, first.lease_token, encode_result(1)[0])
    assert stack.wake_puts() == marked + 1


def test_cancelling_a_pending_call_on_a_capped_queue_frees_no_slot_and_wakes_no_one(
    stack: Stack,
) -> None:
    t = stack.transport()
    t.ensure_queue(QueueSpec("full", elasticity={"kind": "fixed", "max": 1}))
    _, waiting = t.submit([job("full"), job("full")])
    assert len(t.claim(["full"], "w1", limit=4)) == 1
    assert t.claim(["full"], "w2", limit=4) == []  # capped: marked
    marked = stack.wake_puts()
    assert t.cancel(waiting) is State.CANCELLED
    assert stack.wake_puts() == marked
