"""``lakeshore dev``: the AWS path on one machine — a moto server whose requests are
serialised, the template's tables and bucket in it, the Lambda handlers over HTTP, the
sweeper on its schedule.

The documented flow runs against it as against ``lakeshore serve`` (the seed's fan-out
example with LAKESHORE_URL set, a worker process with its own token); the request lock
is checked under contention; the command itself runs as a subprocess and stops on
SIGINT and SIGTERM.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from test_remote_flow import Plane, make_token, run_producer, seed_example

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.devstack import DevStack, SerialisedWSGI
from dreamlake.lakeshore.plane import QueueSpec, State, Submission
from dreamlake.lakeshore.stores.dynamo import DynamoStore, make_clients
from dreamlake.lakeshore.wire import encode_ref_call, encode_result

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def stack() -> Iterator[DevStack]:
    """One dev stack for the module, sweeping four times a second."""
    with DevStack(sweep_every=0.25) as running:
        yield running


@pytest.fixture(scope="module")
def plane(stack: DevStack) -> Plane:
    url, admin = stack.url, stack.admin_token
    return Plane(url, admin, make_token(url, admin, "producer"), make_token(url, admin, "worker"))


def boto_clients(stack: DevStack) -> tuple[Any, Any]:
    import boto3

    session = boto3.Session(
        aws_access_key_id="test", aws_secret_access_key="test", region_name=stack.region
    )
    return make_clients(stack.region, stack.moto_endpoint, session=session)


# --- the stack ---------------------------------------------------------------------------


def test_the_lambda_handlers_serve_a_dynamodb_plane_built_from_the_template(
    stack: DevStack, plane: Plane
) -> None:
    # Given a running dev stack
    # When a producer says hello over HTTP
    with dls.Dispatch(plane.url, token=plane.producer) as dp:
        hello = dp.transport.hello(refresh=True)  # type: ignore[attr-defined]
    # Then the answer comes from the dev stack, whose plane is the DynamoDB store
    assert hello["server"] == "lakeshore dev"
    assert isinstance(stack.plane.store, DynamoStore)
    # and moto holds exactly the template's tables and bucket
    ddb, s3 = boto_clients(stack)
    names = stack.resources
    assert set(ddb.list_tables()["TableNames"]) == {
        names.queues,
        names.invocations,
        names.records,
        names.logs,
    }
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == [names.bucket]
    rules = s3.get_bucket_lifecycle_configuration(Bucket=names.bucket)["Rules"]
    assert rules  # the template's lifecycle rules came along
    ddb.close()
    s3.close()


def test_the_template_is_reachable_from_the_package_as_the_one_file() -> None:
    # The package's template.yaml is the repository's (a link in a checkout; the wheel
    # carries its content), so the tables dev builds cannot drift from the stack's.
    packaged = resources.files("dreamlake.lakeshore.infra") / "template.yaml"
    assert packaged.read_bytes() == (ROOT / "template.yaml").read_bytes()
    link = ROOT / "infra" / "template.yaml"
    assert link.is_symlink() and os.readlink(link) == "../template.yaml"


def test_a_second_stack_in_the_same_process_is_refused_without_harm(
    stack: DevStack, plane: Plane
) -> None:
    # Given a running stack, when another starts in this process (moto is process-wide)
    with pytest.raises(RuntimeError, match="one dev stack per process"):
        DevStack().start()
    # Then the first keeps its tables and its tokens
    with dls.Dispatch(plane.url, token=plane.producer) as dp:
        assert dp.transport.hello(refresh=True)["server"] == "lakeshore dev"  # type: ignore[attr-defined]


# --- the documented flow -----------------------------------------------------------------


@pytest.fixture
def worker(plane: Plane, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``lakeshore worker start`` against dev with the worker's token, as its own process."""
    env = {**os.environ, "LAKESHORE_HOME": str(tmp_path / "home")}
    env.pop("LAKESHORE_URL", None)
    env.pop("LAKESHORE_TOKEN", None)
    cmd = [sys.executable, "-m", "dreamlake.lakeshore.cli", "worker", "start"]
    args = ["-q", "fan-out-demo", "--concurrency", "3", "--url", plane.url, "--token", plane.worker]
    proc = subprocess.Popen([*cmd, *args], env=env)
    yield proc
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_the_seed_fan_out_runs_against_dev_with_a_worker_process(
    plane: Plane, worker: object, tmp_path: Path
) -> None:
    # Given the seed's fan-out example with LAKESHORE_URL set and no _dispatch= anywhere
    code = seed_example("fan_out.py") + "print(asyncio.run(fan_out(30)))\n"
    assert "_dispatch" not in code and ":memory:" not in code
    # When it runs as a producer process while a worker process serves the queue
    out = run_producer(plane, code, tmp_path)
    # Then every result comes back, through the Lambda handlers and DynamoDB
    assert json.loads(out) == [i * i for i in range(30)]


# --- the request lock ----------------------------------------------------------------------


def test_the_request_lock_gives_no_double_claims_under_concurrent_workers(plane: Plane) -> None:
    # Given 300 jobs on one queue
    jobs = 300
    payload = encode_ref_call("math:sqrt", (4.0,), {}).payload
    with dls.Dispatch(plane.url, token=plane.producer) as producer:
        producer.transport.ensure_queue(QueueSpec("race"))
        subs = [Submission(id=f"race-{i:03d}", queue="race", payload=payload) for i in range(jobs)]
        for start in range(0, jobs, 100):
            producer.transport.submit(subs[start : start + 100])
    claims: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    refused: list[Exception] = []
    guard = threading.Lock()
    result = encode_result(2.0)[0]

    def work(n: int) -> None:
        with dls.Dispatch(plane.url, token=plane.worker) as dp:
            idle = 0
            while idle < 3:
                got = dp.transport.claim(["race"], f"racer-{n}", limit=1, wait=0.2)
                idle = 0 if got else idle + 1
                with guard:
                    for c in got:
                        claims[c.id].append((n, c.attempt))
                answers = dp.transport.complete_many([(c.id, c.lease_token, result) for c in got])
                with guard:
                    refused.extend(a for a in answers if a is not None)

    # When four workers claim one at a time, all at once, through the HTTP front
    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=100)
    # Then each job was claimed once, on its first attempt, and recorded once
    assert sorted(claims) == sorted(s.id for s in subs)
    doubles = {inv: who for inv, who in claims.items() if len(who) > 1}
    assert not doubles
    assert {attempt for who in claims.values() for _, attempt in who} == {1}
    assert not refused
    assert len({n for who in claims.values() for n, _ in who}) > 1  # they did contend
    with dls.Dispatch(plane.url, token=plane.producer) as producer:
        recs = producer.transport.get_many([s.id for s in subs])
    assert {(r.state, r.attempt) for r in recs} == {(State.SUCCEEDED, 1)}


def test_serialised_wsgi_lets_one_request_in_at_a_time() -> None:
    # Given an app that notes how many requests it is answering at once
    inside, peak = 0, 0
    count = threading.Lock()
    bodies: list[bytes] = []

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        nonlocal inside, peak
        with count:
            inside += 1
            peak = max(peak, inside)
        bodies.append(environ["wsgi.input"].read())
        time.sleep(0.01)
        with count:
            inside -= 1
        start_response("200 OK", [])
        return iter([b"a", b"b"])

    wrapped = SerialisedWSGI(app)
    answers: list[list[bytes]] = []

    def call(i: int) -> None:
        import io

        environ = {"wsgi.input": io.BytesIO(b"x" * i + b"tail"), "CONTENT_LENGTH": str(i)}
        answers.append(wrapped(environ, lambda *a: None))

    # When eight requests arrive together
    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then moto saw one at a time, each with exactly its declared body, answered in full
    assert peak == 1
    assert sorted(bodies) == [b"x" * i for i in range(8)]
    assert answers == [[b"a", b"b"]] * 8


# --- the sweeper -----------------------------------------------------------------------------


def test_the_sweeper_hands_an_abandoned_lease_on_without_any_claim(
    stack: DevStack, plane: Plane
) -> None:
    # Given a job claimed with a one-second lease by a worker that then vanishes
    with dls.Dispatch(plane.url, token=plane.producer) as producer:
        inv = dls.SyncQueue("abandoned", dispatch=producer).submit("math:sqrt", 9.0)
    with dls.Dispatch(plane.url, token=plane.worker) as dp:
        (claim,) = dp.transport.claim(["abandoned"], "ghost", lease_seconds=1)
    assert claim.id == inv
    assert stack.sweeper is not None
    rounds = stack.sweeper.rounds
    # When nobody claims (claims sweep too), only the scheduled sweeper runs: a round
    # after the lease expired hands the job on (and counts it once the round, which goes
    # on to purge, has ended)
    assert stack.sweeper.wait_until(lambda s: s.rounds > rounds and s.handled >= 1, 15), (
        "the sweeper never returned the job"
    )
    # Then the job is pending again, its attempt kept for the next claim
    with dls.Dispatch(plane.url, token=plane.producer) as producer:
        assert producer.transport.get(inv).state is State.PENDING


# --- the command ---------------------------------------------------------------------------

#: until `dev` is registered in cli/app.py (by its owner), a typer app of its own
OWN_APP = [
    sys.executable,
    "-c",
    "import typer\n"
    "from dreamlake.lakeshore.cli.dev import dev\n"
    "app = typer.Typer(add_completion=False)\n"
    "app.command()(dev)\n"
    "app()\n",
]


def dev_command() -> list[str]:
    """``python -m dreamlake.lakeshore.cli dev`` once registered, else :data:`OWN_APP`."""
    from dreamlake.lakeshore.cli.app import app

    names = {c.name or getattr(c.callback, "__name__", "") for c in app.registered_commands}
    if "dev" in names:
        return [sys.executable, "-m", "dreamlake.lakeshore.cli", "dev"]
    return OWN_APP


def start_dev(*args: str) -> tuple[subprocess.Popen[str], str, list[str]]:
    """Start the dev command; return it, its URL and the lines up to its banner's end."""
    proc = subprocess.Popen(
        [*dev_command(), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:  # up to the banner's last line; the caller reads the rest
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
            if line.startswith("direct"):
                return

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            seen.append(lines.get(timeout=0.1))
        except queue.Empty:
            continue
        if seen[-1].startswith("direct"):
            url = re.search(r"serving the Lambda handlers at (http://\S+)", "".join(seen))
            assert url is not None, seen
            return proc, url.group(1), seen
    proc.kill()
    out, _ = proc.communicate()
    pytest.fail(f"lakeshore dev did not start:\n{''.join(seen)}{out}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_dev_command_prints_its_url_and_token_once_and_stops_on_a_signal(sig: int) -> None:
    # Given `lakeshore dev --port 0` running as its own process
    proc, url, banner = start_dev("--sweep-every", "5")
    text = "".join(banner)
    token = re.search(r"admin token: (lks_\S+)", text)
    assert token is not None, text
    assert f"export LAKESHORE_URL={url} LAKESHORE_TOKEN={token.group(1)}" in text
    assert re.search(
        r'Dispatch\("aws://env\?region=us-east-1&endpoint=http://127\.0\.0\.1:\d+"\)', text
    )
    # and answering the API with the printed token
    with dls.Dispatch(url, token=token.group(1)) as dp:
        assert dp.transport.hello(refresh=True)["server"] == "lakeshore dev"  # type: ignore[attr-defined]
    # When it gets the signal
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=20)
    # Then it stops cleanly, having shown the token only in its banner
    assert proc.returncode == 0, text + rest
    assert "lakeshore dev: stopped" in rest
    assert token.group(1) not in rest
