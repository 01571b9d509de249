"""The documented flow against a real ``lakeshore serve``: the seed's fan-out examples
with LAKESHORE_URL set and the ``_dispatch=`` arguments removed, a producer and a worker
in separate processes with their own tokens, and curl as a producer."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.server import serve_in_thread

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Plane:
    url: str
    admin: str
    producer: str
    worker: str


def make_token(url: str, admin: str, role: str) -> str:
    proc = subprocess.run(
        [
            "curl", "-sf", "-X", "POST", f"{url}/v1/tokens",
            "-H", f"Authorization: Bearer {admin}", "-H", "Content-Type: application/json",
            "-d", json.dumps({"role": role, "name": f"test {role}"}),
        ],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return str(json.loads(proc.stdout)["token"])


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    with serve_in_thread(tmp_path / "plane.db") as (url, admin):
        assert admin is not None
        yield Plane(
            url, admin, make_token(url, admin, "producer"), make_token(url, admin, "worker")
        )


@pytest.fixture
def worker(plane: Plane, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``lakeshore worker start`` with the worker's token, as its own process."""
    env = {**os.environ, "LAKESHORE_HOME": str(tmp_path / "home")}
    env.pop("LAKESHORE_URL", None)
    env.pop("LAKESHORE_TOKEN", None)
    cmd = [sys.executable, "-m", "dreamlake.lakeshore.cli", "worker", "start"]
    queues = ["-q", "fan-out-demo", "-q", "pipeline-demo", "-q", "tools"]
    args = [*queues, "--concurrency", "3", "--url", plane.url, "--token", plane.worker]
    proc = subprocess.Popen([*cmd, *args], env=env)
    yield proc
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def run_producer(plane: Plane, code: str, tmp_path: Path) -> str:
    """Run ``code`` as a script with only LAKESHORE_URL and the producer's token."""
    script = tmp_path / "producer.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "LAKESHORE_URL": plane.url, "LAKESHORE_TOKEN": plane.producer}
    env["LAKESHORE_HOME"] = str(tmp_path / "producer-home")
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def seed_example(name: str) -> str:
    """An example with the seed's step 7 applied: no ``_dispatch=``/``dispatch=``, no
    embedded plane or in-process worker — real workers serve the queue."""
    source = (ROOT / "examples" / name).read_text()
    source = re.sub(r",\s*_dispatch=dp", "", source)
    source = re.sub(r",\s*dispatch=dp", "", source)
    source = re.sub(r",\s*dp\)", ")", source)
    source = re.sub(r"dp\)", ")", source)
    return source.split("\ndef main(")[0] + "\n"


def test_fan_out_against_serve_with_separate_producer_and_worker(
    plane: Plane, worker: object, tmp_path: Path
) -> None:
    code = seed_example("fan_out.py") + "print(asyncio.run(fan_out(50)))\n"
    assert "_dispatch" not in code and ":memory:" not in code
    out = run_producer(plane, code, tmp_path)
    assert json.loads(out) == [i * i for i in range(50)]


def test_pipeline_and_stream_against_serve(plane: Plane, worker: object, tmp_path: Path) -> None:
    pipeline = seed_example("pipeline.py") + "print(asyncio.run(pipeline()))\n"
    out = run_producer(plane, pipeline, tmp_path)
    assert eval(out) == [{"n": 2 * i, "hex": hex(2 * i)} for i in range(6)]
    stream = seed_example("fan_out_stream.py") + "asyncio.run(fan_out(6))\n"
    lines = run_producer(plane, stream, tmp_path).splitlines()
    assert sorted(lines) == sorted(f"  completed: slow_square({i}) = {i * i}" for i in range(6))


def test_tokens_keep_roles_apart(plane: Plane) -> None:
    with dls.Dispatch(plane.url, token=plane.producer) as producer, pytest.raises(dls.Forbidden):
        producer.transport.claim(["tools"], "sneaky")
    with dls.Dispatch(plane.url, token=plane.worker) as worker, pytest.raises(dls.Forbidden):
        dls.SyncQueue("tools", dispatch=worker).submit("math:sqrt", 4.0)


def curl(plane: Plane, *args: str) -> dict[str, object]:
    proc = subprocess.run(
        ["curl", "-s", "-H", f"Authorization: Bearer {plane.producer}", *args],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return dict(json.loads(proc.stdout))


def test_curl_submits_a_ref_call_and_reads_its_result(plane: Plane, worker: object) -> None:
    # The README's curl example, as written there
    submitted = curl(
        plane, "-X", "POST", f"{plane.url}/v1/invocations",
        "-H", "Content-Type: application/json",
        "-d", '{"invocations": [{"queue": "tools", "ref": "math:sqrt", "args": [16]}]}',
    )  # fmt: skip
    (inv,) = submitted["ids"]  # type: ignore[misc]
    waited = curl(
        plane, "-X", "POST", f"{plane.url}/v1/invocations/wait",
        "-H", "Content-Type: application/json", "-d", json.dumps({"ids": [inv], "timeout": 20}),
    )  # fmt: skip
    assert waited["invocations"]
    view = curl(plane, f"{plane.url}/v1/invocations/{inv}")["invocation"]
    assert view["state"] == "succeeded"  # type: ignore[index]
    assert view["value"] == 4.0  # type: ignore[index]
    # and a body without a content type is a 4xx that says what to send
    bad = curl(plane, "-X", "POST", f"{plane.url}/v1/invocations", "-d", "{nope")
    assert bad["error"]["code"] == "unsupported_media_type"  # type: ignore[index]
    assert "Content-Type: application/json" in bad["error"]["message"]  # type: ignore[index]


def test_a_running_worker_advertises_its_python_and_pickle_protocols(
    plane: Plane, worker: object
) -> None:
    from dreamlake.lakeshore.wire import PICKLE_PROTOCOL, PY_VERSION

    with dls.Dispatch(plane.url, token=plane.producer) as dp:
        deadline = time.monotonic() + 30
        while True:  # the worker registers as it starts
            hello = dp.transport.hello(refresh=True)  # type: ignore[attr-defined]
            if hello["workers"]["python"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert hello["workers"]["python"] == [PY_VERSION]
        assert PICKLE_PROTOCOL in hello["workers"]["pickle_protocols"]
