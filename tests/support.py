"""Helpers the tests share (imported as ``support``: the tests folder is on the path)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.server import LocalServer, PlaneASGI


def wait_for(
    predicate: Callable[[], bool],
    timeout: float = 20.0,
    message: str = "condition not reached in time",
    every: float = 0.01,
) -> None:
    """Return once ``predicate()`` holds: for a state that nothing announces (threads
    asleep in a condition, requests parked in a server, a file a thread writes), looked
    at again every ``every`` seconds, failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, message
        time.sleep(every)


def role_token(server: LocalServer, role: str) -> str:
    """A new token of ``role`` on a running :class:`LocalServer` (made by its admin)."""
    assert server.admin_token is not None
    with dls.Dispatch(server.url, token=server.admin_token) as admin:
        secret = admin.transport.create_token(role)["token"]  # type: ignore[attr-defined]
    return str(secret)


def counting_calls(obj: object, name: str, monkeypatch: Any) -> list[float]:
    """The times ``obj.name(...)`` is called from now on (the test's monkeypatch puts it
    back)."""
    called: list[float] = []
    real = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        called.append(time.monotonic())
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, counted)
    return called


def threads_of(obj: object, name: str, monkeypatch: Any) -> list[str]:
    """The names of the threads ``obj.name(...)`` runs on from now on (the test's
    monkeypatch puts it back)."""
    seen: list[str] = []
    real = getattr(obj, name)

    def spied(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, spied)
    return seen


def asleep_on_watch(monkeypatch: Any) -> Callable[[], bool]:
    """From now on, whether a plane file's poller sleeps on its watch of the file until a
    write (past its linger after the last one; not looking at its pace)."""
    from dreamlake.lakeshore.plane import changes
    from dreamlake.lakeshore.stores import SqliteStore

    asleep = [0]
    real = SqliteStore.write_watch

    def watching(store: SqliteStore) -> Any:
        watch = real(store)
        if watch is not None:
            wait = watch.wait

            def waiting(timeout: float) -> bool:
                long = timeout >= changes.WATCH_SAFETY
                asleep[0] += long
                try:
                    return wait(timeout)
                finally:
                    asleep[0] -= long

            watch.wait = waiting  # type: ignore[method-assign]
        return watch

    monkeypatch.setattr(SqliteStore, "write_watch", watching)
    return lambda: asleep[0] > 0


def parked_claims_settled(
    plane: Plane, asgi: PlaneASGI, claims: int, *, handed_to: bool = False
) -> None:
    """Wait until ``claims`` claims are parked on a served plane, its poller has taken
    its first look (a change: it wakes them once) and every wake has been answered (none
    due, none taken and not yet looked again); with ``handed_to``, until each is on the
    plane's books for a submit's hand-over too."""
    wait_for(
        lambda: (
            plane.changes.polling
            and asgi.held()[0] == claims
            and (not handed_to or len(plane.changes._takers) == claims)
            and not asgi._wake_due
            and not any(waiter.done() for waiter in list(asgi._parked))
        ),
        10,
        "the parked claims never settled",
    )
