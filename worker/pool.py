"""The process worker behind ``lakeshore worker start``: one child process per slot.

::

    fetcher thread: claims up to the free slots + a prefetch buffer (long-polls), or
                    leaves an idle worker's claim to a job process (below)
    main loop (one thread)                        child process per slot (reused)
    ─ start buffered claims on free slots ──run─▶ load payload, call it, capture
    ─ read child messages ◀──out/progress/done─── stdout/stderr and progress
    ─ kill a slot past its timeout or cancelled    (exec jobs: their own process group)
    reporter thread: completes / fails what finished, all of it in one batch a round
    heartbeat thread: extends every lease (buffered ones too), learns of cancels

The prefetch buffer holds claims beyond the free slots only while jobs are short: it
covers about :data:`_PREFETCH_SECONDS` of work at the recent job time (at most
``prefetch`` claims), and is empty when jobs take longer than that — a long job never
waits on a busy worker while another is idle. Only a worker with a free slot waits on
the plane for work: one whose slots are all busy tops its buffer up from work already
queued, without waiting (a claim parked there would take the next call from an idle
worker), and once that comes back short, asks again when a slot frees. Buffered claims
are heartbeated like running ones, dropped when cancelled and handed back when the
worker stops.

A worker with nothing to do on a plane close by (one where job processes complete lone
jobs, see :meth:`ProcessWorker._reports_here`) leaves its claim to an idle slot's job
process: the child long-polls over its own connection, tells the parent what it leased
(``("claimed", ...)``, before anything else) and runs the first at once, so a
lone call's claim, job and completion never pass through this process. The parent
owns what the child leased from then on: it starts the others on free slots or buffers
them, heartbeats them, kills on timeout or cancel, and hands them back on a stop (a
job process that claimed runs none of them once its worker stops: a flag the stop sets).

A job that crashes (segfault, ``os._exit``) or leaks memory takes down its child only:
the slot is respawned and the invocation failed (or retried by policy). A worker killed
outright takes its job processes, and the commands they run, with it (Linux: see
:mod:`.lifeline`; the main loop's thread starts them all). Signals only
set flags: the first SIGINT/SIGTERM stops claiming and lets in-flight jobs finish
(exit 0); the second kills them and hands their leases back untried.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .. import logs
from ..dispatch import Dispatch
from ..errors import LakeshoreError
from ..plane.model import Claim
from ..wire import PICKLE_PROTOCOL, PY_VERSION, decode_payload
from .child import CHUNK, child_main
from .execute import Outcome, read_unchecked
from .loop import default_worker_id
from .pipes import Pipe, wait
from .report import report_many

__all__ = ["ProcessWorker", "on_stop_signals"]

log = logging.getLogger("dreamlake.lakeshore.worker")

#: seconds between flushes of buffered job output to the plane
_LOG_FLUSH = 0.25
#: seconds of work at the recent job time the prefetch buffer covers
_PREFETCH_SECONDS = 0.1
#: weight of the newest job in the running average of job time
_EMA = 0.2
#: short jobs sent to a child behind the one it runs (it starts each as the last ends)
_PIPELINE = 8
#: a job running this long (seconds) gets the claims queued behind it handed back
_HAND_BACK_AFTER = 0.25
#: seconds the fetcher waits for the main loop to start a claim on a free slot before it
#: asks for more (the job starts sooner when the two do not contend for the GIL)
_YIELD_SECONDS = 0.005
#: a job process completes lone jobs itself only if it lives for at least this many
#: jobs (its first completion opens a connection of its own to the plane)
_REPORTS_AFTER = 16
#: ... and only while reporting takes at most this long (seconds, a running average): a
#: plane on this machine or the LAN, not one across the internet or behind a gateway
#: (``lakeshore dev``, AWS: tens of ms). At 1 ms a busy 2-core machine's own server
#: turned it off run by run (its reports took 1-2 ms)
_REPORT_HERE_SECONDS = 0.005
#: buffered claims no slot could start for this long (seconds) go back to the plane
_BUFFER_MAX_WAIT = 1.0
#: a job process making the worker's claim asks the plane for at most this long at a
#: time (seconds), so that it sees a stop soon (as the fetcher's claims do)
_CLAIM_WAIT_CAP = 2.0
#: seconds past that it gets to answer a stop before it is killed
_CLAIM_GRACE = 5.0


#: while claims keep failing, the fetcher says so again this often (seconds)
_FAILING_REMINDER = 60.0
#: what a refused token most often means, said with its refusal
_TOKEN_HINT = (
    " (a plane that started afresh — `lakeshore dev`, which keeps nothing across a"
    " restart, or a new plane file — knows none of the tokens before it: restart this"
    " worker with a current one)"
)


class _Failing:
    """What a worker says while its claims fail (the plane away, or refusing): the reason
    at the first failure, each other kind of reason as it first comes, and each kind
    again at most every :data:`_FAILING_REMINDER` seconds while it lasts (not a line a
    second, however the kinds alternate); then when a claim goes through again. Told
    from the fetcher and from the main loop (a job process's claim)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        #: when each kind of reason was last told, this time claims failed
        self._told: dict[str, float] = {}

    def failed(self, reason: str) -> None:
        """A claim failed: ``reason`` is ``"<error type>: <message>"``."""
        kind = reason.partition(":")[0]
        now = time.monotonic()
        with self._lock:
            first = self.since is None
            since = self.since = now if self.since is None else self.since
            if first:
                self._told.clear()
            last = self._told.get(kind)
            if last is not None and now - last < _FAILING_REMINDER:
                return
            self._told[kind] = now
        if "unknown or wrong token" in reason:
            reason += _TOKEN_HINT
        if first:
            log.warning("lakeshore worker: a claim failed: %s; retrying", reason)
        else:
            log.warning(
                "lakeshore worker: claims still failing after %.0fs: %s; retrying",
                now - since,
                reason,
            )

    def answered(self) -> None:
        with self._lock:
            since, self.since = self.since, None
        if since is not None:
            log.warning(
                "lakeshore worker: claims go through again, after %.0fs",
                time.monotonic() - since,
            )


@dataclass
class _Slot:
    index: int
    proc: Any = None
    conn: Any = None  # a Pipe
    #: the pipe the child rings once it has sent a message the main loop must read now
    #: (a Pipe; it sends others quietly: the main loop reads those at its next turn), or
    #: before a large one: the loop then waits on the messages' pipe too (``watch``)
    #: until it has read one, so the child's write never waits long for it
    bell: Any = None
    watch: bool = False
    claim: Claim | None = None
    #: when the job must be done by (its timeout), in monotonic time
    deadline: float | None = None
    #: why the parent killed the child: "cancel" | "timeout" | "cold" | "stop" | None
    killed: str | None = None
    #: the id of the job it was killed for
    killed_for: str | None = None
    #: process group of a running exec job
    pgid: int | None = None
    #: function bodies this child has already received
    sent: set[str] = field(default_factory=set)
    jobs: int = 0
    #: buffered output: (n, stream, text) not yet sent to the plane
    out: list[tuple[int, str, str]] = field(default_factory=list)
    out_n: int = 0
    cancel_requested: bool = False
    #: the child said the job has ended and it completes it on the plane itself
    finishing: bool = False
    #: when the running job was handed to the child (monotonic)
    started: float = 0.0
    #: claims sent to the child behind the running one (short jobs without a timeout)
    queued: deque[Claim] = field(default_factory=deque)
    #: replace the child once it has run what it was sent
    recycle: bool = False
    #: claims taken back from ``queued`` that the child must not start: id → the claim
    #: to hand back to the plane once the child confirms (None: cancelled, nothing to do)
    skips: dict[str, Claim | None] = field(default_factory=dict)
    #: ids of ``skips`` the child has not been told of yet
    untold: set[str] = field(default_factory=set)
    #: the child is making the worker's claim (see :class:`_Delegation`)
    claiming: bool = False


@dataclass
class _Delegation:
    """A claim the fetcher left to an idle slot's job process."""

    limit: int
    wait: float
    #: the slot whose child makes it (None: not sent yet)
    slot: _Slot | None = None
    #: answered: what the child leased, or None when no child made it or it failed
    done: bool = False
    claims: list[Claim] | None = None
    error: str | None = None


def on_stop_signals(stop: Callable[[], None]) -> Callable[[], None]:
    """Call ``stop()`` on SIGINT and SIGTERM; returns the function that puts the handlers
    there were before back. Signal handlers belong to the main thread: elsewhere this
    does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: Any) -> None:
        stop()

    for s in previous:
        signal.signal(s, on_signal)

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)

    return restore


class ProcessWorker:
    """Serve ``queues`` of ``dispatch`` with ``concurrency`` child processes."""

    def __init__(
        self,
        dispatch: Dispatch,
        queues: Sequence[str],
        *,
        concurrency: int = 1,
        imports: Sequence[str] = (),
        lease_seconds: float = 60.0,
        worker_id: str | None = None,
        max_idle_wait: float = 2.0,
        max_jobs_per_child: int | None = None,
        max_child_rss_mb: float | None = None,
        on_claimed: Callable[[Claim], None] | None = None,
        prefetch: int = 64,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch < 0:
            raise ValueError("prefetch must be at least 0")
        self.dispatch = dispatch
        self.transport = dispatch.transport
        self.queues = list(queues)
        self.concurrency = concurrency
        self.imports = list(imports)
        self.lease_seconds = lease_seconds
        self.worker_id = worker_id or default_worker_id()
        self.max_idle_wait = max_idle_wait
        self.max_jobs_per_child = max_jobs_per_child
        self.max_child_rss_mb = max_child_rss_mb
        self._on_claimed = on_claimed
        self._ctx = multiprocessing.get_context("spawn")
        self._slots = [_Slot(i) for i in range(concurrency)]
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._cold = threading.Event()
        #: stop requests so far (``next`` on it is one step: safe in a signal handler)
        self._stops = itertools.count()
        #: set (synchronously, signal-safe) by the first stop: a job process that made
        #: the worker's claim runs nothing it leased once this is set
        self._stop_flag = self._ctx.RawValue("b", 0)
        self._beat_stop = threading.Event()
        self._blob_cache: dict[str, bytes] = {}
        #: a job process reads its large argument blob from the plane itself (a URL or a
        #: plane file it can open), not through this process and its pipe
        self._job_reads_blobs = dispatch.target != ":memory:"
        #: a job process may complete a lone job over its own connection to a remote
        #: plane (see :meth:`_alone`), saving the hand-over back to this process
        self._job_reports = dispatch.target.startswith(("http://", "https://"))
        #: running average of how long reporting outcomes takes (seconds; None: not yet)
        self.report_seconds: float | None = None
        self._next_flush = 0.0
        #: at most this many claims wait in the buffer (fewer for longer jobs)
        self.prefetch = prefetch
        #: running average of job seconds (None until a job finished)
        self.job_seconds: float | None = None
        #: claims leased and waiting for a free slot, oldest first
        self._ready: deque[Claim] = deque()
        #: claims taken from it that the main loop is starting now
        self._starting = 0
        #: when each of them arrived (monotonic)
        self._ready_since: dict[str, float] = {}
        #: when a slot last started a job (monotonic)
        self._last_start = 0.0
        #: the claim the fetcher left to a job process, until it is answered
        self._delegated: _Delegation | None = None
        #: what the worker says while its claims fail
        self._failing = _Failing()
        #: when the main loop first saw a stop with a job process claiming (monotonic)
        self._stop_seen: float | None = None
        #: outcomes waiting for the reporter
        self._done: list[tuple[Claim, Outcome]] = []
        self._reporting = False
        lock = threading.RLock()
        self._cv = threading.Condition(lock)
        #: what the reporter waits on (outcomes in ``_done``, or the end), beside ``_cv``
        #: on its lock: the fetcher's many notifications (a slot freed, a claim taken, a
        #: delegated claim answered: several a job) do not wake it for nothing
        self._outcomes = threading.Condition(lock)
        #: what the fetcher waits on while a job process makes its claim (the answer)
        self._answered = threading.Condition(lock)
        wake_r, self._wake_w = multiprocessing.Pipe(duplex=False)
        self._wake_r = Pipe(wake_r)
        self.completed = 0

    # ------------------------------------------------------------------ control
    def set_queues(self, queues: Sequence[str]) -> None:
        """Serve these queues from the next claim on (a daemon's live update)."""
        self.queues = list(queues)

    def set_concurrency(self, concurrency: int) -> None:
        """Grow or shrink the slots; a busy slot goes once its job is done."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency

    @property
    def running(self) -> int:
        """Jobs in flight now."""
        return sum((s.claim is not None) + len(s.queued) for s in self._slots)

    def _buffer_target(self) -> int:
        """Claims the buffer may hold now: ~``_PREFETCH_SECONDS`` of recent work."""
        seconds = self.job_seconds
        if seconds is None or seconds >= _PREFETCH_SECONDS:
            return 0
        now = time.monotonic()
        if any(s.claim is not None and now - s.started > _PREFETCH_SECONDS for s in self._slots):
            return 0  # a job running long now says more than the average of the last ones
        per_slot = int(_PREFETCH_SECONDS / max(seconds, 1e-4))
        return min(self.prefetch, per_slot * self.concurrency)

    def _room(self) -> int:
        """Claims the worker may take now: its free slots and buffer (``_cv`` held)."""
        return self.concurrency + self._buffer_target() - self.running - len(self._ready)

    def _resize(self) -> None:
        grew = len(self._slots) < self.concurrency
        while len(self._slots) < self.concurrency:
            slot = _Slot(max((s.index for s in self._slots), default=-1) + 1)
            self._spawn(slot)
            self._slots.append(slot)
        if grew:
            for slot in self._slots:
                if slot.claiming:
                    self._read(slot)  # (its quiet word, if it came: see _send_claim)
            self._end_chain()  # (the fetcher claims for the new slots)
            with self._cv:
                self._cv.notify_all()  # free slots, for the fetcher
        for slot in list(self._slots):
            if len(self._slots) <= self.concurrency:
                break
            if slot.claim is None and not slot.claiming:
                self._retire(slot)
                self._slots.remove(slot)

    def request_stop(self) -> None:
        """First call: finish in-flight jobs and stop. Second: stop cold. Later ones
        change nothing. Safe from a signal handler, also one that interrupted a call."""
        self._stop_flag.value = 1
        # (setting an Event takes its lock: a signal handler that set the one the
        # interrupted main thread was setting would wait on itself, so each Event is
        # set by one call only, the one its number in the count names)
        n = next(self._stops)
        if n == 0:
            self._stopping.set()
        elif n == 1:
            self._cold.set()
        self._wake()

    def _install_signals(self) -> Callable[[], None]:
        return on_stop_signals(self.request_stop)

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        """Serve until stopped; return how many jobs were reported."""
        restore = self._install_signals()
        for slot in self._slots:
            self._spawn(slot)
        threads = [
            threading.Thread(target=self._heartbeats, name="lakeshore-heartbeat", daemon=True),
            threading.Thread(target=self._fetch_loop, name="lakeshore-fetch", daemon=True),
            threading.Thread(target=self._report_loop, name="lakeshore-report", daemon=True),
        ]
        for t in threads:
            t.start()
        said = 0  # the stops told to whoever watches (1: the warm one, 2: the cold one)
        try:
            while True:
                # (a claiming child's word may start a job: it is read before the rest)
                if self._cold.is_set():
                    if said < 2 and self.running:
                        said = 2
                        log.warning(
                            "lakeshore worker: stopping now, handing %d job(s) back",
                            self.running,
                        )
                    claiming = self._claiming_on_stop()
                    self._stop_cold()
                    if not claiming:
                        break
                elif self._stopping.is_set():
                    if said < 1 and self.running:
                        said = 1
                        log.warning(
                            "lakeshore worker: stopping once %d running job(s) finish"
                            " (stop again to hand them back now)",
                            self.running,
                        )
                    claiming = self._claiming_on_stop()
                    self._hand_back_buffer()
                    # (a claim taken back from a child is answered: run, or handed back)
                    busy = any(s.claim is not None or s.skips for s in self._slots)
                    if not claiming and not busy:
                        break
                self._resize()
                self._start_ready()
                self._delegate()
                self._pump(0.05)
                self._enforce()
                if time.monotonic() >= self._next_flush:
                    self._next_flush = time.monotonic() + _LOG_FLUSH
                    self._flush_output()
        finally:
            if not self._stopping.is_set():  # (the loop raised: see request_stop)
                self.request_stop()
            with self._cv:
                self._answer_delegation(None, None, None)
                self._cv.notify_all()
            threads[1].join(timeout=5)  # a claim in flight ends within 2 s of a stop
            self._hand_back_buffer()
            with self._cv:
                self._cv.wait_for(lambda: not self._done and not self._reporting, timeout=30)
            self._beat_stop.set()
            with self._cv:
                self._cv.notify_all()
                self._outcomes.notify_all()
                self._answered.notify_all()
            for t in threads:
                t.join(timeout=5)
            for slot in self._slots:
                self._retire(slot)
            self._wake_r.close()
            self._wake_w.close()
            restore()
        return self.completed

    # ------------------------------------------------------------------ claims
    def _fetch_loop(self) -> None:
        """Keep the free slots and the buffer supplied with claims (long-polls)."""
        dry = False  # the last claim came back short: the queues had no more then
        failing = self._failing
        while not self._stopping.is_set():
            with self._cv:
                room = self._room()
                free = self._has_free_slot()
                # Every slot busy: the buffer takes only work already queued (a claim
                # waiting on the plane would take the next call from an idle worker),
                # and once the queues ran dry, nothing until a slot frees.
                if room <= 0 or not self.queues or (dry and not free):
                    self._cv.wait(0.5)
                    continue
                delegate = free and self._may_delegate()
            limit = min(room, 500)
            if delegate:
                job = self._claim_in_child(limit)
                if job.claims is not None:  # (the main loop started and buffered them)
                    dry = len(job.claims) < limit
                    if len(job.claims) > 1:  # let the main loop start them first
                        with self._cv:
                            taken = partial(self._taken, job.claims[1].id)
                            self._cv.wait_for(taken, _YIELD_SECONDS)
                    continue
                if self._stopping.is_set():
                    continue
                if job.error is not None:
                    failing.failed(job.error)
                    self._beat_stop.wait(1.0)
                    continue
            try:
                claims = self.transport.claim(
                    self.queues,
                    self.worker_id,
                    limit=limit,
                    wait=self.max_idle_wait if free else 0,
                    lease_seconds=self.lease_seconds,
                    should_stop=self._stopping.is_set,
                )
            except LakeshoreError as exc:
                # the plane away (the transport already retried), or refusing: the
                # reason once, then ask again every second
                failing.failed(f"{type(exc).__name__}: {exc}")
                self._beat_stop.wait(1.0)
                continue
            failing.answered()
            dry = len(claims) < limit
            if claims:
                now = time.monotonic()
                idle = self.running < self.concurrency
                with self._cv:
                    self._ready.extend(claims)
                    self._ready_since.update((c.id, now) for c in claims)
                self._wake()
                if idle:
                    # A slot is free: let the main loop start the job before this thread
                    # builds its next claim (holding the GIL the main loop waits for).
                    with self._cv:
                        self._cv.wait_for(partial(self._taken, claims[0].id), _YIELD_SECONDS)

    def _may_delegate(self) -> bool:
        """Whether the fetcher leaves its next claim, which waits for work (a slot is
        free), to an idle slot's job process (``_cv`` held): on a plane close enough
        that job processes complete lone jobs (:meth:`_reports_here`), with nothing
        buffered to start first."""
        return self._reports_here() and not self._ready and self._starting == 0

    def _claim_in_child(self, limit: int) -> _Delegation:
        """Leave the worker's claim to an idle slot's job process (the main loop picks
        the slot and, once the child answers, starts and buffers what it leased) and
        wait for the answer. ``claims`` None: no job process made it (make it here)."""
        job = _Delegation(limit, min(self.max_idle_wait, _CLAIM_WAIT_CAP))
        with self._cv:
            if self._stopping.is_set():  # (the main loop may have stopped already)
                job.done = True
                return job
            self._delegated = job
        self._wake()
        with self._cv:
            # The main loop answers it: the child's word, its death, or a stop (a
            # chain of lone jobs, see _chain, may keep it open for a while).
            while not job.done and not self._beat_stop.is_set():
                self._answered.wait(1.0)
        return job

    def _delegate(self) -> None:
        """Send the claim the fetcher left to an idle slot's child, or give it back."""
        with self._cv:
            job = self._delegated
            if job is None or job.slot is not None:
                return
        slot = next((s for s in self._slots if self._can_claim(s)), None)
        if slot is None or self._stopping.is_set():
            with self._cv:
                self._answer_delegation(None, None, None)
            return
        self._send_claim(slot, job)

    def _send_claim(self, slot: _Slot, job: _Delegation) -> None:
        """Have ``slot``'s child make the delegated claim ``job`` (its word comes back as a
        ``claimed`` message)."""
        alone = self._alone(slot)
        # (one slot: nothing waits on the child's word that it leased work, which it
        # then sends without ringing: see _pump)
        quiet = len(self._slots) == 1 == self.concurrency
        with self._lock:
            slot.claiming = True
            job.slot = slot
        try:
            slot.conn.send(
                ("claim", list(self.queues), self.worker_id, job.limit, job.wait,
                 self.lease_seconds, alone, quiet)
            )  # fmt: skip
        except (OSError, ValueError):
            self._died(slot)

    def _chain(self, slot: _Slot, *, reported: bool) -> None:
        """The lone job a job process leased for the fetcher's delegated claim has
        ended: if the child completed it itself and nothing else goes on, the same child
        makes the worker's next claim at once, for the delegation the fetcher still
        waits on (a lone call's path then skips the hand-over to the fetcher and back:
        two thread wake-ups and the wake pipe's, a job). Anything else ends the chain:
        the delegation is answered (nothing more leased) and the fetcher carries on."""
        with self._cv:
            job = self._delegated
            if job is None or job.slot is not slot or slot.claiming:
                return
            room = self._room()
            if not (
                reported
                and room > 0
                # (one slot, and no more wanted: a resize not yet made would have the
                # chain lease calls for slots whose job processes are not up, and they
                # would wait for this one's next free turn)
                and self.concurrency == len(self._slots) == 1
                and self.queues
                and not self._stopping.is_set()
                and self._may_delegate()
                and self._can_claim(slot)
            ):
                self._answer_delegation(slot, [], None)
                return
            job.limit = min(room, 500)
        self._send_claim(slot, job)

    def _end_chain(self, slot: _Slot | None = None) -> None:
        """A job holds the fetcher's delegation open (see :meth:`_chain`) and its child
        is gone or going (``slot``), or the worker has new slots (any slot): answer it,
        nothing more leased, so the fetcher carries on."""
        with self._cv:
            job = self._delegated
            holder = None if job is None else job.slot
            if holder is not None and not holder.claiming and (slot is None or slot is holder):
                self._answer_delegation(holder, [], None)

    @staticmethod
    def _can_claim(slot: _Slot) -> bool:
        """Whether the slot's child may make the worker's claim: alive and idle."""
        return (
            slot.proc is not None
            and slot.claim is None
            and not slot.queued
            and not slot.skips
            and not slot.killed
            and not slot.recycle
            and not slot.claiming
        )

    def _answer_delegation(
        self, slot: _Slot | None, claims: list[Claim] | None, error: str | None
    ) -> None:
        """The delegated claim is answered (``_cv`` held): by ``slot``'s child, or
        (``slot`` None) by no child at all."""
        job = self._delegated
        if job is None or (slot is not None and job.slot is not slot):
            return
        job.claims, job.error, job.done = claims, error, True
        self._delegated = None
        self._answered.notify_all()

    def _claimed_in_child(
        self,
        slot: _Slot,
        claims: list[Claim],
        error: str | None,
        runs: bool,
        started: float | None = None,
    ) -> None:
        """The child's word on the claim it made: it runs the first claim now (``runs``;
        this process owns it from here) and the others wait in the buffer for a free
        slot; once the worker stops it runs none, and the buffer hands them back."""
        with self._lock:
            slot.claiming = False
        if error is None:  # (the one place a job process's claim is heard of as made)
            self._failing.answered()
        now = time.monotonic()
        with self._cv:
            waiting = claims[1:] if runs else claims
            self._ready.extend(waiting)
            self._ready_since.update((c.id, now) for c in waiting)
        if claims and runs:
            self._begin(slot, claims[0], started)
        with self._cv:
            job = self._delegated
            # One job, run by the child of the worker's only slot: the delegation stays
            # open, and the job's end may carry the claim on (see _chain). With more
            # slots it is answered: a slot that frees meanwhile needs the fetcher (and
            # a job sent while others ran was not the child's to complete: no chain).
            held = job is not None and job.slot is slot and runs and len(claims) == 1
            if not held or len(self._slots) > 1:
                self._answer_delegation(slot, claims if error is None else None, error)
        if claims and runs and self._on_claimed is not None:
            self._on_claimed(claims[0])

    def _claiming_on_stop(self) -> bool:
        """Whether a job process still makes the worker's claim, once stopping. It gets
        the claim's wait and a margin to answer (killing it mid-request could leave a
        lease nobody is told of); what it leased it does not run, and the buffer hands
        it back. Past that, it is killed."""
        claiming = [s for s in self._slots if s.claiming]
        if not claiming:
            return False
        now = time.monotonic()
        if self._stop_seen is None:
            self._stop_seen = now
        if now - self._stop_seen < _CLAIM_WAIT_CAP + _CLAIM_GRACE:
            return True
        for slot in claiming:
            self._read(slot)  # its word, if it came meanwhile, counts
            if not slot.claiming:
                continue
            self._kill(slot, "stop")
            if slot.proc is not None:
                slot.proc.join(timeout=5)
            self._drop_claiming(slot)
        return any(s.claiming for s in self._slots)

    def _drop_claiming(self, slot: _Slot) -> None:
        """The slot's child is gone, or going, while it made the worker's claim: hand
        back what it said it leased and had not been read yet, and answer the fetcher.
        (Leases it took and could not tell of stay held until they expire.)"""
        if not slot.claiming:
            return
        with contextlib.suppress(EOFError, OSError, ValueError):
            while slot.conn.ready():
                msg = slot.conn.recv()
                if msg[0] == "claimed":
                    for claim in msg[1]:
                        with contextlib.suppress(LakeshoreError):
                            self.transport.release(claim.id, claim.lease_token)
        with self._lock:
            slot.claiming = False
        with self._cv:
            self._answer_delegation(slot, None, None)

    def _taken(self, inv_id: str) -> bool:
        """Whether the main loop took the buffered claim ``inv_id`` (or is stopping)."""
        return inv_id not in self._ready_since or self._stopping.is_set()

    def _wake(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._wake_w.send_bytes(b"")

    def _start_ready(self) -> None:
        """Start buffered claims on the free slots, oldest first; behind a short job
        without a timeout, send a few more short ones so the child never waits on us."""
        for slot in self._slots:
            if slot.proc is None or self._stopping.is_set() or slot.killed or slot.claiming:
                continue
            if slot.claim is None:
                claim = self._take_ready(lambda c: True)
                if claim is None:
                    return
                self._start_taken(slot, claim)
            while (
                slot.claim is not None
                and slot.claim.timeout is None
                and len(slot.queued) < _PIPELINE
                and self._buffer_target() > 0
            ):
                claim = self._take_ready(lambda c: c.timeout is None)
                if claim is None:
                    break
                self._start_taken(slot, claim, behind=True)

    def _take_ready(self, fits: Callable[[Claim], bool]) -> Claim | None:
        with self._cv:
            if not self._ready or not fits(self._ready[0]):
                return None
            claim = self._ready.popleft()
            self._ready_since.pop(claim.id, None)
            self._starting += 1
            self._cv.notify_all()  # room for the fetcher
            return claim

    def _start_taken(self, slot: _Slot, claim: Claim, *, behind: bool = False) -> None:
        """Start a claim :meth:`_take_ready` gave; until it runs (or failed to load),
        :attr:`_starting` counts it for the fetcher."""
        try:
            self._start(slot, claim, behind=behind)
        finally:
            with self._cv:
                self._starting -= 1
                self._cv.notify_all()  # (the fetcher may be waiting for a free slot)

    def _has_free_slot(self) -> bool:
        """Whether a slot has no job and none is on its way to it (``_cv`` held)."""
        idle = sum(1 for s in self._slots if s.claim is None and s.proc is not None)
        return idle > self._starting

    def _release_stale(self, now: float) -> None:
        """Buffered claims go back to the plane when the buffer stopped draining: no
        slot started a job for a while (they all run long ones), so others may take
        them. A buffer that drains slowly (a slow plane) keeps them."""
        with self._cv:
            if (
                not self._ready
                or now - self._last_start < _BUFFER_MAX_WAIT
                or now - self._ready_since.get(self._ready[0].id, now) < _BUFFER_MAX_WAIT
            ):
                return
            stale = [c for c in self._ready if now - self._ready_since.get(c.id, now) >= 0.5]
            for c in stale:
                self._ready.remove(c)
                self._ready_since.pop(c.id, None)
            self._cv.notify_all()
        for c in stale:
            with contextlib.suppress(LakeshoreError):
                self.transport.release(c.id, c.lease_token)

    def _hand_back_buffer(self) -> None:
        """Release the claims no slot has started (another worker may take them)."""
        with self._cv:
            waiting, self._ready = list(self._ready), deque()
            self._ready_since.clear()
        for claim in waiting:
            with contextlib.suppress(LakeshoreError):
                self.transport.release(claim.id, claim.lease_token)

    # ------------------------------------------------------------------ reports
    def _report_loop(self) -> None:
        """Report what finished: every outcome waiting, in one batch per round."""
        while True:
            with self._cv:
                self._outcomes.wait_for(lambda: bool(self._done) or self._beat_stop.is_set())
                if not self._done:
                    return
                done, self._done = self._done, []
                self._reporting = True
            try:
                self._report(done)
            except Exception:
                log.exception("lakeshore worker: reporting %d outcomes failed", len(done))
            finally:
                with self._cv:
                    self._reporting = False
                    self._cv.notify_all()

    def _report(self, done: list[tuple[Claim, Outcome]]) -> None:
        started = time.monotonic()
        report_many(self.dispatch, done)
        if len(done) == 1 and not done[0][1].blobs:  # (a batch's time is not the plane's)
            self._took_to_report(time.monotonic() - started)

    def _took_to_report(self, seconds: float) -> None:
        """One lone outcome's report time, into the running average :meth:`_alone`
        goes by."""
        with self._cv:
            last = self.report_seconds
            self.report_seconds = seconds if last is None else (1 - _EMA) * last + _EMA * seconds

    def _record(self, claim: Claim, outcome: Outcome, *, reported: bool = False) -> None:
        with self._cv:
            self.completed += 1
            self._cv.notify_all()  # a slot is free: the fetcher may claim meanwhile
            if reported:  # the job process completed it on the plane itself
                return
            # The only outcome and nothing else to do: report it from here, which saves
            # the hand-over to the reporter on a lone job's path. Otherwise the
            # reporter sends it with the others.
            alone = (
                not self._done
                and not self._reporting
                and not self._ready
                and self.running == 0
                and outcome.ok
                and outcome.manifest is None
            )
            if alone:
                self._reporting = True
            else:
                self._done.append((claim, outcome))
                self._outcomes.notify()
        if alone:
            try:
                self._report([(claim, outcome)])
            except Exception:
                log.exception("lakeshore worker: reporting %s failed", claim.id)
            finally:
                with self._cv:
                    self._reporting = False
                    self._cv.notify_all()

    # ------------------------------------------------------------------ slots
    def _spawn(self, slot: _Slot) -> None:
        # Always from the thread that runs run() (its loop, or its start): a job process
        # dies with the thread that started it (Linux, see lifeline.py), and this one
        # outlives them all. Starting one from another thread (the fetcher, the
        # heartbeat) would have it killed whenever that thread ended.
        parent, child = self._ctx.Pipe()
        bell, ring = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=child_main,
            args=(
                child,
                self.imports,
                self.transport.inline_limit(),
                self.dispatch.target,
                self.dispatch.token,
                self._stop_flag,
                os.getpid(),
                ring,
            ),
            name=f"lakeshore-slot-{slot.index}",
            daemon=True,
        )
        proc.start()
        child.close()
        ring.close()
        slot.proc, slot.conn, slot.bell = proc, Pipe(parent), Pipe(bell)
        slot.sent, slot.jobs, slot.killed, slot.pgid = set(), 0, None, None
        slot.killed_for, slot.watch = None, False
        slot.recycle = False
        slot.queued.clear()
        slot.skips.clear()
        slot.untold.clear()

    def _retire(self, slot: _Slot) -> None:
        if slot.proc is None:
            return
        self._end_chain(slot)
        with contextlib.suppress(OSError, ValueError):
            slot.conn.send(("stop",))
        slot.proc.join(timeout=2)
        if slot.proc.is_alive():
            slot.proc.kill()
            slot.proc.join(timeout=5)
        self._drop_claiming(slot)
        slot.conn.close()
        slot.bell.close()
        slot.proc = None

    def _start(self, slot: _Slot, claim: Claim, *, behind: bool = False) -> None:
        blobs: dict[str, bytes] = {}
        try:
            env = decode_payload(claim.payload)
            fn = env["fn"] if isinstance(env.get("fn"), str) else None
            if fn is not None and fn not in slot.sent:
                blobs[fn] = self._blob(fn)
            if env.get("args_ref") and not self._job_reads_blobs:
                blobs[env["args_ref"]] = self._blob(env["args_ref"])
        except LakeshoreError as exc:
            # nothing to run: fail it here, with the reason, and keep the slot free
            error = {
                "type": "dreamlake.lakeshore.CannotLoad",
                "message": f"cannot load the call on this worker: {exc}",
                "traceback": "",
                "pickled": None,
            }
            self._record(claim, Outcome(ok=False, error=error, retryable=False))
            return
        alone = not behind and self._alone(slot)
        if behind:
            with self._lock:
                slot.queued.append(claim)
        else:
            self._begin(slot, claim)
        slot.conn.send(("run", claim, blobs, alone))
        if fn is not None:
            slot.sent.add(fn)
        if self._on_claimed is not None:
            self._on_claimed(claim)

    def _alone(self, slot: _Slot) -> bool:
        """Whether a job starting on ``slot`` now is the only thing this worker does: then
        its job process may complete it on the plane itself when it ends well, wrote no
        output and has no blobs to upload (one hand-over fewer on a lone call's path;
        with more going on, this process reports outcomes in batches)."""
        if not self._reports_here():
            return False
        with self._cv:
            if self._ready or self._done or self._reporting:
                return False
        return all(s.claim is None and not s.queued for s in self._slots if s is not slot)

    def _reports_here(self) -> bool:
        """Whether job processes complete lone jobs on the plane themselves: a remote
        plane close by, and children that live long enough for their connection."""
        if not self._job_reports:
            return False
        if self.max_jobs_per_child is not None and self.max_jobs_per_child < _REPORTS_AFTER:
            return False  # a child's first completion opens its connection: not worth it
        took = self.report_seconds
        # A plane further away: the child would sit in each completion's round trip
        # while its slot could start the next job (the parent reports meanwhile).
        return took is not None and took <= _REPORT_HERE_SECONDS

    def _begin(self, slot: _Slot, claim: Claim, started: float | None = None) -> None:
        """``claim`` is the job the slot's child runs now (since ``started``, this clock's
        time, if it was said later: a quiet word, see _pump)."""
        logs.event(
            log, "job.started", claim.id, queue=claim.queue, worker=self.worker_id,
            attempt=claim.attempt,
        )  # fmt: skip
        with self._lock:
            slot.claim = claim
            slot.started = time.monotonic() if started is None else started
            self._last_start = max(self._last_start, slot.started)
            slot.deadline = slot.started + claim.timeout if claim.timeout else None
            slot.out, slot.out_n, slot.cancel_requested = [], 0, False
            slot.finishing = False

    def _next_in_child(self, slot: _Slot) -> None:
        """The child starts the next claim it was sent as soon as one ends."""
        with self._lock:
            nxt = slot.queued.popleft() if slot.queued else None
        if nxt is not None:
            self._begin(slot, nxt)

    def _blob(self, digest: str) -> bytes:
        """A blob for a child, read once (the child's executor checks it before use)."""
        data = self._blob_cache.get(digest)
        if data is None:
            data = read_unchecked(self.transport, digest)
            if len(self._blob_cache) > 256:
                self._blob_cache.clear()
            self._blob_cache[digest] = data
        return data

    # ------------------------------------------------------------------ messages
    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a child's bell, a child's end or a wake, and handle
        them; then read what any child sent quietly (its word that it leased work, that
        its job ended: nothing here waits on either, and a wake-up of this process on
        the call's path would take a core the call needs)."""
        owners: dict[Any, tuple[_Slot, Any]] = {}
        for slot in self._slots:
            if slot.proc is not None:
                owners[slot.bell] = owners[slot.proc.sentinel] = (slot, slot.proc)
                if slot.watch:
                    owners[slot.conn] = (slot, slot.proc)
        waiting: list[Any] = [*owners, self._wake_r]
        for ready in wait(waiting, timeout):
            if ready is self._wake_r:
                with contextlib.suppress(EOFError, OSError):
                    while self._wake_r.ready():
                        self._wake_r.recv_bytes()
                continue
            slot, proc = owners[ready]
            if slot.proc is not proc:
                continue  # this child was already handled (its bell and sentinel both fired)
            if ready is slot.bell:
                with contextlib.suppress(EOFError, OSError):  # (at its end: see _read)
                    while slot.bell.ready():
                        slot.bell.recv_bytes()
                # (rung before a large message is written: watched until it comes)
                slot.watch = not self._read(slot)
            elif ready is slot.conn:
                slot.watch = not self._read(slot)
            elif not slot.proc.is_alive():
                self._died(slot)
        for slot in list(self._slots):
            if slot.proc is not None:
                self._read(slot)

    def _read(self, slot: _Slot) -> bool:
        """Handle every message waiting on the slot's pipe (a closed pipe: it died).
        Whether there was any (or the child is gone)."""
        conn: Any = slot.conn
        read = False
        try:
            # (a message may retire the child and spawn another: its pipe is new then)
            while slot.conn is conn and conn.ready():
                msg = conn.recv()
                read = True
                self._message(slot, msg)
        except (EOFError, OSError):
            if slot.conn is conn:
                self._died(slot)
            return True
        return read or slot.conn is not conn

    def _message(self, slot: _Slot, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "claimed":
            self._claimed_in_child(slot, *msg[1:])
            return
        if msg[1] in slot.skips and kind in ("skipped", "done"):
            self._skip_answered(slot, msg)
            return
        claim = slot.claim
        if claim is None or msg[1] != claim.id:
            return  # from a job we already gave up on
        if kind == "out":
            self._buffer(slot, msg[2], msg[3])
        elif kind == "pgid":
            slot.pgid = msg[2]
        elif kind == "finishing":
            with self._lock:
                slot.finishing = True
        elif kind == "progress":
            with contextlib.suppress(LakeshoreError):
                self.transport.report_progress(claim.id, claim.lease_token, msg[2], msg[3])
        elif kind == "done":
            _, _, outcome, rss_mb, reported, took = msg
            if took is not None:
                self._took_to_report(took)
            self._flush_output(slot)
            self._finish(slot, outcome, reported=reported)
            self._next_in_child(slot)
            slot.jobs += 1
            slot.recycle = slot.recycle or bool(
                (self.max_jobs_per_child and slot.jobs >= self.max_jobs_per_child)
                or (self.max_child_rss_mb and rss_mb > self.max_child_rss_mb)
            )
            if slot.recycle and slot.claim is None:
                self._retire(slot)
                self._spawn(slot)
            self._chain(slot, reported=reported)

    def _skip_answered(self, slot: _Slot, msg: tuple[Any, ...]) -> None:
        """The child's answer about a claim taken back from behind a running job."""
        with self._lock:
            claim = slot.skips.pop(msg[1])
            slot.untold.discard(msg[1])
        if msg[0] == "skipped":
            if claim is not None:  # handed back untried
                with contextlib.suppress(LakeshoreError):
                    self.transport.release(claim.id, claim.lease_token)
            return
        # It had started before the child heard of the skip: report what it did (the
        # plane refuses it if it was cancelled meanwhile).
        if claim is not None:
            self._record(claim, msg[2])

    def _finish(self, slot: _Slot, outcome: Outcome, *, reported: bool = False) -> None:
        """Free the slot now; the outcome is reported with the others of this round
        (``reported``: the job process completed it on the plane already)."""
        claim = slot.claim
        assert claim is not None
        took = time.monotonic() - slot.started
        with self._lock:
            slot.claim, slot.deadline, slot.pgid = None, None, None
        self.job_seconds = (
            took if self.job_seconds is None else (1 - _EMA) * self.job_seconds + _EMA * took
        )
        logs.event(
            log, "job.finished", claim.id, queue=claim.queue, worker=self.worker_id,
            ok=outcome.ok, error_type=(outcome.error or {}).get("type"),
        )  # fmt: skip
        self._record(claim, outcome, reported=reported)

    def _died(self, slot: _Slot) -> None:
        """The child is gone: report its job as the reason says, then respawn it. What it
        sent before it went is read first (a claim it leased and said so quietly is then
        this process's, failed as the crash it was; a job it said it finished is not)."""
        conn: Any = slot.conn
        with contextlib.suppress(EOFError, OSError):
            while slot.conn is conn and conn.ready():
                self._message(slot, conn.recv())
        if slot.conn is not conn or slot.proc is None:
            return  # (a message already retired it, and respawned the slot)
        self._end_chain(slot)
        code = None
        if slot.proc is not None:
            slot.proc.join(timeout=5)  # its pipe can close before it is reaped
            code = slot.proc.exitcode
        claim, reason = slot.claim, slot.killed
        with self._lock:
            behind = [*slot.queued, *(c for c in slot.skips.values() if c is not None)]
            slot.queued, slot.skips, slot.untold = deque(), {}, set()
        if claim is not None and reason is not None and claim.id != slot.killed_for:
            # (killed for the job before it, whose end was read only now: this one had
            # barely begun, and was not what the kill was for)
            behind.append(claim)
            claim = None
        for waiting in behind:  # never started: hand them back untried
            with contextlib.suppress(LakeshoreError):
                self.transport.release(waiting.id, waiting.lease_token)
        self._flush_output(slot)
        self._retire(slot)
        if claim is not None and reason is None:
            if code is not None and code < 0:
                what = f"signal {-code} ({signal.Signals(-code).name})"
            else:
                what = f"exit code {code}"
            error = {
                "type": "dreamlake.lakeshore.WorkerCrashed",
                "message": f"the job's process died with {what}",
                "traceback": "",
                "pickled": None,
            }
            self._finish(slot, Outcome(ok=False, error=error))
        elif claim is not None and reason == "timeout":
            error = {
                "type": "dreamlake.lakeshore.InvocationTimeout",
                "message": f"invocation exceeded its timeout of {claim.timeout:g}s and was killed",
                "traceback": "",
                "pickled": None,
            }
            self._finish(slot, Outcome(ok=False, error=error))
        with self._lock:
            slot.claim, slot.deadline, slot.pgid = None, None, None
        if not self._cold.is_set():
            self._spawn(slot)
        with self._cv:
            self._cv.notify_all()  # a free slot again, for the fetcher

    def _kill(self, slot: _Slot, reason: str) -> None:
        slot.killed = reason
        slot.killed_for = None if slot.claim is None else slot.claim.id
        if slot.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(slot.pgid, signal.SIGKILL)
        if slot.proc is not None and slot.proc.is_alive():
            slot.proc.kill()

    def _enforce(self) -> None:
        now = time.monotonic()
        self._release_stale(now)
        for slot in self._slots:
            if slot.queued and slot.claim is not None and now - slot.started > _HAND_BACK_AFTER:
                # The running job turned out long: what waits behind it goes back to
                # the plane, for another slot or worker to take.
                with self._lock:
                    for c in slot.queued:
                        slot.skips[c.id] = c
                        slot.untold.add(c.id)
                    slot.queued.clear()
            if slot.untold and slot.proc is not None:
                with self._lock:
                    untold, slot.untold = slot.untold, set()
                for inv_id in untold:
                    with contextlib.suppress(OSError, ValueError):
                        slot.conn.send(("skip", inv_id))
            if slot.claim is None or slot.killed:
                continue
            due = slot.deadline is not None and now >= slot.deadline
            if (slot.cancel_requested or due) and slot.proc is not None:
                # What the child sent first counts: a job that ended and is being
                # completed by its child (a heartbeat then finds it finished, not
                # running) is not killed.
                self._read(slot)
                if slot.claim is None or slot.killed or slot.finishing:
                    continue
                due = slot.deadline is not None and now >= slot.deadline
            if slot.cancel_requested:
                self._kill(slot, "cancel")
            elif due:
                self._kill(slot, "timeout")

    def _stop_cold(self) -> None:
        for slot in self._slots:
            claim = slot.claim
            if claim is None and not slot.skips:
                continue
            self._kill(slot, "cold")
            with self._lock:
                skipped = [c for c in slot.skips.values() if c is not None]
                held = [c for c in (claim, *slot.queued, *skipped) if c is not None]
                slot.queued, slot.skips, slot.untold = deque(), {}, set()
                slot.claim = None
            for c in held:
                with contextlib.suppress(LakeshoreError):
                    self.transport.release(c.id, c.lease_token)

    # ------------------------------------------------------------------ output
    def _buffer(self, slot: _Slot, stream: str, text: str) -> None:
        for start in range(0, len(text), CHUNK):
            slot.out_n += 1
            slot.out.append((slot.out_n, stream, text[start : start + CHUNK]))

    def _flush_output(self, only: _Slot | None = None) -> None:
        for slot in [only] if only else self._slots:
            claim = slot.claim
            if claim is None or not slot.out:
                continue
            chunks, slot.out = slot.out, []
            with contextlib.suppress(LakeshoreError):
                self.transport.append_logs(claim.id, claim.lease_token, chunks)

    # ------------------------------------------------------------------ heartbeats
    def _heartbeats(self) -> None:
        interval = max(0.2, self.lease_seconds / 3)
        while not self._beat_stop.wait(interval):
            with self._lock:
                held: list[tuple[_Slot | None, Claim]] = [
                    (s, s.claim) for s in self._slots if s.claim is not None
                ]
                behind = [(s, c) for s in self._slots for c in s.queued]
            held += behind
            with self._cv:
                held += [(None, c) for c in self._ready]
            for slot, claim in held:
                try:
                    answer = self.transport.heartbeat(
                        claim.id, claim.lease_token, lease_seconds=self.lease_seconds
                    )
                except Exception:
                    continue  # the next beat tries again; the lease has slack
                if not (answer.cancel or not answer.ok):
                    continue
                if slot is None:  # still buffered: never start it
                    with self._cv, contextlib.suppress(ValueError):
                        self._ready.remove(claim)
                        self._ready_since.pop(claim.id, None)
                    continue
                with self._lock:
                    if slot.claim is claim:
                        slot.cancel_requested = True
                    elif claim in slot.queued:  # the main loop tells the child
                        slot.queued.remove(claim)
                        slot.skips[claim.id] = None
                        slot.untold.add(claim.id)


#: what a worker advertises to the plane
ADVERTISED = {"python": PY_VERSION, "pickle_protocols": list(range(2, PICKLE_PROTOCOL + 1))}
