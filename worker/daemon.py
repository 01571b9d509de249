"""Fleet daemons: a process worker whose queues and concurrency live on the plane.

``lakeshore daemon start --name gpu-1`` registers with the plane under an id kept in
``$LAKESHORE_HOME/daemons/<name>.id``, so a restart is the same daemon. Every
heartbeat (default 15 s) returns the record as the plane has it; the daemon follows it
at once — new queues, another concurrency, or a drain (finish in-flight work, exit).

``lakeshore worker start`` is a daemon with a fresh identity each start
(``persist=False``): it advertises its Python and pickle protocols to the plane
(``GET /v1/hello`` → ``workers``), shows in ``daemon ls`` and takes updates too, and
its record is removed as it exits (one killed outright stays, shown as silent).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from .. import config
from ..dispatch import Dispatch
from ..errors import NotFound
from ..plane.model import DaemonRecord
from ..wire import PICKLE_PROTOCOL, PY_VERSION
from .pool import ProcessWorker, on_stop_signals

__all__ = ["Daemon"]

#: seconds an exiting ``worker start`` waits for the plane to forget its record
FORGET_WAIT = 3.0


class Daemon:
    def __init__(
        self,
        dispatch: Dispatch,
        name: str,
        *,
        queues: Sequence[str] = (),
        concurrency: int = 1,
        imports: Sequence[str] = (),
        lease_seconds: float = 60.0,
        heartbeat_every: float = 15.0,
        state_dir: Path | None = None,
        persist: bool = True,
    ) -> None:
        self.dispatch = dispatch
        self.name = name
        self.state_dir = state_dir or config.settings().home.expanduser() / "daemons"
        self.heartbeat_every = heartbeat_every
        self.persist = persist
        self._start_queues, self._start_concurrency = list(queues), concurrency
        self._imports, self._lease_seconds = list(imports), lease_seconds
        self.record: DaemonRecord | None = None
        self.worker: ProcessWorker | None = None
        self._stop = threading.Event()
        self._changed: Callable[[DaemonRecord], None] | None = None

    @property
    def _id_file(self) -> Path:
        return self.state_dir / f"{self.name}.id"

    def register(self) -> DaemonRecord:
        known = None
        if self.persist and self._id_file.exists():
            known = self._id_file.read_text().strip()
        rec = self._register(known or None, self._start_queues, self._start_concurrency)
        if self.persist:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._id_file.write_text(rec.id + "\n")
        self.record = rec
        return rec

    def _register(
        self, daemon_id: str | None, queues: Sequence[str], concurrency: int
    ) -> DaemonRecord:
        """Register with the plane (under ``daemon_id``; None: a new id), advertising
        this process's Python and pickle protocols; the queues and concurrency count
        only where the plane has no record of that id."""
        return self.dispatch.transport.register_daemon(
            self.name,
            daemon_id=daemon_id,
            queues=queues,
            concurrency=concurrency,
            python=PY_VERSION,
            pickle_protocols=list(range(2, PICKLE_PROTOCOL + 1)),
            host=socket.gethostname(),
        )

    def run(
        self,
        announce: Callable[[DaemonRecord], None] | None = None,
        changed: Callable[[DaemonRecord], None] | None = None,
    ) -> int:
        """Register (unless done already), serve until drained or signalled; return
        jobs reported. ``announce`` is called with the record once registered,
        ``changed`` with each record a heartbeat brings whose queues, concurrency or
        drain differ from the last (the daemon follows it)."""
        self._changed = changed
        # A SIGINT/SIGTERM while registering (before there is a worker) is noted: the
        # worker then starts stopped and exits 0, instead of the process dying of the
        # signal. From the moment the worker exists, a signal goes straight to it (one
        # handler replacing the other, never the default in between), and the signals
        # noted before are handed on after that (two: a cold stop), so none is lost.
        early: list[int] = []
        restore_early = on_stop_signals(lambda: early.append(1))  # (one step: signal-safe)
        try:
            rec = self.record or self.register()
            if announce is not None:
                announce(rec)
            self.worker = ProcessWorker(
                self.dispatch,
                rec.queues,
                concurrency=rec.concurrency,
                imports=self._imports,
                lease_seconds=self._lease_seconds,
                worker_id=f"{rec.id}@{rec.host}",
            )
            restore_worker = on_stop_signals(self.worker.request_stop)
        except BaseException:
            restore_early()
            raise
        for _ in early[:2]:
            self.worker.request_stop()
        beat = threading.Thread(target=self._beat, name="lakeshore-daemon", daemon=True)
        beat.start()
        ended = False
        try:
            done = self.worker.run()
            ended = True
            return done
        finally:
            self._stop.set()
            beat.join(timeout=10)
            transport = self.dispatch.transport
            if not self.persist:  # (a fresh identity each start: gone with this process)
                self._last_word(lambda: transport.remove_daemon(rec.id))
            elif ended and not beat.is_alive():
                # (its record stays: shown stopped, not silent as if it crashed; not said
                # while a heartbeat may still land after it and say it runs)
                self._last_word(lambda: transport.daemon_heartbeat(rec.id, 0, stopped=True))
            restore_worker()
            restore_early()

    def _last_word(self, say: Callable[[], object]) -> None:
        """Tell the plane this daemon is leaving (its record removed, or marked stopped),
        waiting at most FORGET_WAIT seconds: a plane that is away does not hold up the
        exit (the record then stays as it was, and falls silent)."""

        def run() -> None:
            with contextlib.suppress(Exception):  # (best effort: the process is leaving)
                say()

        t = threading.Thread(target=run, name="lakeshore-daemon-leaving", daemon=True)
        t.start()
        t.join(FORGET_WAIT)

    def request_stop(self) -> None:
        if self.worker is not None:
            self.worker.request_stop()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_every):
            worker, rec = self.worker, self.record
            if worker is None or rec is None:
                continue
            try:
                rec = self.dispatch.transport.daemon_heartbeat(rec.id, worker.running)
            except NotFound:
                # the plane forgot it (removed): it registers again as it runs now
                with contextlib.suppress(Exception):
                    self.record = self._register(rec.id, rec.queues, rec.concurrency)
                continue
            except Exception:
                continue  # the plane is away; keep serving what we have
            last, self.record = self.record, rec
            worker.set_queues(rec.queues)
            worker.set_concurrency(rec.concurrency)
            if self._changed is not None and _followed(last) != _followed(rec):
                self._changed(rec)
            if rec.draining:
                worker.request_stop()
                return


def _followed(rec: DaemonRecord | None) -> tuple[object, ...]:
    """What of a daemon's record it follows (a change of it is told)."""
    return () if rec is None else (tuple(rec.queues), rec.concurrency, rec.draining)
