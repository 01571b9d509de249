"""The dashboard in a real browser: headless Chromium over a real ``lakeshore serve`` with
real worker processes (a daemon of two slots).

One plane for the module; the tests run in file order, as an operator would: sign in,
watch a fan-out finish, read a failed invocation's traceback, cancel a running one,
pause a queue, drain the daemon. Each page is saved as a screenshot under
``screenshots/`` (gitignored); ``docs/img/dashboard.png`` is a copy of the queues page.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.server import serve_in_thread
from dreamlake.lakeshore.worker.daemon import Daemon

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parent.parent / "screenshots"
QUEUE = "ui-fan-out"

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make setup-dev)"),
]

# the jobs travel by value: the worker's children need not import this test module
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def square(x: int) -> int:
    print(f"squaring {x}")
    dls.progress(0.5, f"half of {x}")
    time.sleep(0.15)
    return x * x


def explode(x: int) -> int:
    raise ValueError(f"cannot take {x}")


def slow(seconds: float) -> float:
    for i in range(int(seconds * 10)):
        dls.progress(i / (seconds * 10), f"step {i}")
        time.sleep(0.1)
    return seconds


class Plane:
    def __init__(self, url: str, admin: str) -> None:
        self.url, self.admin = url, admin

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        req = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {token or self.admin}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def token(self, role: str) -> str:
        token: str = self.call("POST", "/v1/tokens", {"role": role})["token"]
        return token


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    path = tmp_path_factory.mktemp("dash") / "plane.db"
    with serve_in_thread(path) as (url, admin):
        assert admin is not None
        yield Plane(url, admin)


@pytest.fixture(scope="module")
def daemon(plane: Plane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    dp = dls.Dispatch(plane.url, token=plane.token("worker"))
    d = Daemon(
        dp,
        "ui-daemon",
        queues=[QUEUE],
        concurrency=2,
        lease_seconds=3.0,
        heartbeat_every=0.5,
        state_dir=tmp_path_factory.mktemp("daemons"),
        persist=False,
    )
    d.register()
    thread = threading.Thread(target=d.run, daemon=True)
    thread.start()
    yield d
    d.request_stop()
    d.request_stop()
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def producer(plane: Plane) -> dls.SyncQueue:
    return dls.SyncQueue(QUEUE, dispatch=dls.Dispatch(plane.url, token=plane.token("producer")))


@pytest.fixture(scope="module")
def page(plane: Plane) -> Iterator[Any]:
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        tab = browser.new_page(viewport={"width": 1280, "height": 860})
        tab.set_default_timeout(20_000)
        yield tab
        browser.close()


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def cell(page: Any, state: str) -> Any:
    return page.locator(f'#queues tr[data-queue="{QUEUE}"] td[data-state="{state}"]')


def test_a_wrong_token_is_refused_and_a_right_one_signs_in(page: Any, plane: Plane) -> None:
    # Given the plane's root, which sends the browser to the dashboard
    page.goto(plane.url + "/")
    assert page.url.endswith("/ui/")
    shot(page, "1-login")
    # When a wrong token is tried, the form stays with the reason
    page.fill("#token", "lks_nope_" + "x" * 32)
    page.click("#login button")
    page.wait_for_selector("#login-error:has-text('refused')")
    # And with the admin token the queues page opens, the token only in sessionStorage
    page.fill("#token", plane.admin)
    page.click("#login button")
    page.wait_for_selector("#nav:not([hidden])")
    page.wait_for_selector("text=Queues")
    stored = page.evaluate("sessionStorage.getItem('lakeshore.token')")
    assert stored == plane.admin
    assert page.evaluate("localStorage.length") == 0


def test_a_fan_out_progresses_to_completion(
    page: Any, producer: dls.SyncQueue, daemon: Daemon
) -> None:
    # Given 24 squares submitted to a queue a two-slot daemon serves
    ids = [producer.submit(square, i) for i in range(24)]
    page.goto(page.url.split("#")[0] + "#/queues")
    # Then the page shows work under way, then every one succeeded
    page.wait_for_function(
        f"""() => {{
          const row = document.querySelector('#queues tr[data-queue="{QUEUE}"]');
          return row && Number(row.querySelector('td[data-state="succeeded"]').textContent) > 0
              && Number(row.querySelector('td[data-state="succeeded"]').textContent) < 24;
        }}"""
    )
    cell(page, "succeeded").filter(has_text="24").wait_for()
    assert cell(page, "failed").inner_text() == "0"
    assert [producer.result(i, timeout=10) for i in ids] == [i * i for i in range(24)]
    # And the throughput chart has bars for them
    page.wait_for_selector("svg[aria-label='Throughput per minute'] rect")
    shot(page, "2-queues")


def test_a_failed_invocation_shows_its_remote_traceback(
    page: Any, plane: Plane, producer: dls.SyncQueue, daemon: Daemon
) -> None:
    # Given a call that raises on the worker
    inv = producer.submit(explode, 7)
    with pytest.raises(ValueError, match="cannot take 7"):
        producer.result(inv, timeout=20)
    # When the operator opens the queue's failed list and clicks it
    page.goto(page.url.split("#")[0] + f"#/queue/{QUEUE}?state=failed")
    page.click(f'#invocations tr[data-id="{inv}"] a')
    # Then the invocation page shows the call, its error and the traceback from the worker
    page.wait_for_selector("#traceback")
    assert "explode" in page.inner_text("#summary")
    assert "ValueError" in page.inner_text("#error")
    traceback = page.inner_text("#traceback")
    assert traceback.startswith("Traceback") and "in explode" in traceback
    assert traceback.rstrip().endswith("ValueError: cannot take 7")
    assert page.locator("#retry").is_visible()
    shot(page, "3-invocation-failed")


def test_a_running_invocation_is_cancelled_from_the_running_page(
    page: Any, producer: dls.SyncQueue, daemon: Daemon
) -> None:
    # Given a long job that reports progress
    inv = producer.submit(slow, 30.0)
    page.goto(page.url.split("#")[0] + "#/running")
    row = page.locator(f'#running tr[data-id="{inv}"]')
    row.filter(has_text="step").wait_for()
    assert daemon.record is not None
    assert row.locator("td").nth(2).inner_text().startswith(daemon.record.id + "@")
    shot(page, "4-running")
    # When the operator cancels it
    row.locator("button", has_text="Cancel").click()
    # Then it leaves the running list, and the plane has it cancelled
    row.wait_for(state="detached")
    assert producer.status(inv) == "cancelled"
    page.goto(page.url.split("#")[0] + f"#/inv/{inv}")
    page.wait_for_selector("h1 .state.cancelled")


def test_an_id_with_a_percent_sign_is_opened_and_cancelled_as_itself(
    page: Any, plane: Plane
) -> None:
    # Given two calls waiting on a queue no worker serves, one id "%41" away from the other
    waiting = dls.SyncQueue(
        "ui-odd-ids", dispatch=dls.Dispatch(plane.url, token=plane.token("producer"))
    )
    odd = waiting.submit(square, 1, _id="odd%41id")
    plain = waiting.submit(square, 2, _id="oddAid")
    # When the operator opens the odd one from the queue's list and cancels it
    page.goto(page.url.split("#")[0] + "#/queue/ui-odd-ids?state=pending")
    page.click(f'#invocations tr[data-id="{odd}"] a')
    page.wait_for_selector("h1:has-text('odd%41id')")
    page.click("#cancel")
    page.wait_for_selector("h1 .state.cancelled")
    # Then that one is cancelled, and the other (what "%41" decodes to) still waits
    assert (waiting.status(odd), waiting.status(plain)) == ("cancelled", "pending")


def test_pause_and_drain_from_the_dashboard(
    page: Any, plane: Plane, producer: dls.SyncQueue, daemon: Daemon
) -> None:
    # Given the queue paused from the queues page
    page.goto(page.url.split("#")[0] + "#/queues")
    page.locator(f'#queues tr[data-queue="{QUEUE}"] button', has_text="Pause").click()
    page.locator(f'#queues tr[data-queue="{QUEUE}"]', has_text="paused").wait_for()
    # When a job is submitted, it waits
    inv = producer.submit(square, 5)
    time.sleep(1.5)
    assert producer.status(inv) == "pending"
    # Then resuming lets the daemon take it
    page.locator(f'#queues tr[data-queue="{QUEUE}"] button', has_text="Resume").click()
    assert producer.result(inv, timeout=20) == 25
    # And the daemons page shows the daemon healthy; drain stops it
    page.goto(page.url.split("#")[0] + "#/daemons")
    row = page.locator("#daemons tr", has_text="ui-daemon")
    row.filter(has_text="ok").wait_for()
    shot(page, "5-daemons")
    row.locator("button", has_text="Drain").click()
    row.filter(has_text="draining").wait_for()
    if os.environ.get("LAKESHORE_UPDATE_SCREENSHOT"):
        img = Path(__file__).resolve().parent.parent / "docs" / "img"
        img.mkdir(parents=True, exist_ok=True)
        shutil.copy(SHOTS / "2-queues.png", img / "dashboard.png")
