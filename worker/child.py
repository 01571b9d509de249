"""The job process of a process worker's slot: it runs the claims its parent sends, in
order, one at a time, and sends back output, progress and outcomes over its pipe.

A ``("skip", id)`` message cancels a claim sent earlier that has not started: the child
reads every message waiting before it starts the next job, so a skip that follows its
run is seen in time (the answer is ``("skipped", id)``).

A ``("claim", queues, worker, limit, wait, lease_seconds, alone, quiet)`` message asks
this process to make its idle worker's claim over its own connection: it answers
``("claimed", claims, None, True)`` (``("claimed", [], reason, False)`` when the claim
failed) before anything else, then runs the first claim as if it had been sent
(``alone`` when it is the only one), and leaves the others to the parent. Once the
worker is stopping (a flag the parent shares with its job processes, set by the stop
itself) it runs none: ``("claimed", claims, None, False)``, and the parent hands them
all back. ``quiet``: nothing in the parent waits on that word (a one-slot worker), so a
word that leased work does not ring the parent's bell (see :class:`_Sent`).

A claim sent as the worker's only job (``alone``) that ends well, wrote no output,
reported no progress and has no result blobs is completed on the plane by this process,
over its own connection: it tells the parent first (``("finishing", id)``, quietly: the
job has ended, so a heartbeat that finds it finished kills nothing), then sends the completion,
then ``("done", id, outcome, rss, True, seconds)`` (how long the completion took; None
for this process's first, which opens its connection). Otherwise ``("done", id,
outcome, rss, False, None)``: the parent reports it — any other outcome, a completion
that did not reach the plane, or one the plane refused as unreadable.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..dispatch import Dispatch
from ..errors import InvalidRequest, LakeshoreError
from ..heap import keep_freed_memory
from ..plane.model import Claim
from ..wire import decode_payload
from .execute import Outcome, read_unchecked
from .lifeline import CommandGroups, die_with_parent
from .pipes import Pipe, dumps

__all__ = ["CHUNK", "child_main", "fn_of"]

#: bytes of output one log chunk carries at most
CHUNK = 16 * 1024
#: a message larger than this (pickled) rings the parent's bell before it is written,
#: and is never quiet: a write that fills the pipe waits for the parent to read
_RING_FIRST = 32 * 1024


class _Sent:
    """A child's end of the pipe, safe to send on from several threads. With a ``bell``
    (the write end of a second pipe, which the parent waits on instead of this one),
    each message rings it once written, but a ``quiet`` one: the parent reads that with
    the next message that rings, or at its loop's next turn (within 50 ms), not at once —
    waking it on the call's path would put it on a core the call needs."""

    def __init__(self, conn: Pipe, bell: Pipe | None = None) -> None:
        self.conn = conn
        self.bell = bell
        self.lock = threading.Lock()

    def send(self, msg: tuple[Any, ...], *, quiet: bool = False) -> None:
        data = dumps(msg)
        with self.lock:
            if self.bell is None:
                self.conn.send_bytes(data)
            elif len(data) > _RING_FIRST:  # (the parent reads it as it is written)
                self.bell.send_bytes(b"")
                self.conn.send_bytes(data)
            else:
                self.conn.send_bytes(data)
                if not quiet:
                    self.bell.send_bytes(b"")


class _Capture:
    """``sys.stdout``/``sys.stderr`` of a child: lines go to the parent as they come."""

    def __init__(self, pipe: _Sent, stream: str) -> None:
        self.pipe, self.stream = pipe, stream
        self.job: str | None = None
        #: whether the job wrote anything here
        self.wrote = False
        self._buf = ""

    def write(self, text: str) -> int:
        self.wrote = self.wrote or bool(text)
        self._buf += text
        if "\n" in self._buf or len(self._buf) > CHUNK:
            self.flush()
        return len(text)

    def flush(self) -> None:
        if self._buf and self.job is not None:
            self.pipe.send(("out", self.job, self.stream, self._buf))
        self._buf = ""

    def isatty(self) -> bool:
        return False


class _Blobs:
    """The blobs a job reads: those its parent sent, else read from the plane by this
    process (a large argument blob comes straight here, not through the parent and the
    pipe). The executor checks each against its digest before it loads it, so a read
    from a remote plane is not checked here too (that would hash every byte twice), and
    is not kept: a damaged read is read again by the next job that needs it."""

    def __init__(self, limit: int, plane: Callable[[], Dispatch]) -> None:
        self.blobs: dict[str, bytes] = {}
        self.limit = limit
        self.plane = plane

    def get_blob(self, digest: str) -> bytes:
        data = self.blobs.get(digest)
        return read_unchecked(self.plane().transport, digest) if data is None else data

    def inline_limit(self) -> int:
        return self.limit


def child_main(
    conn: Any,
    imports: list[str],
    inline_limit: int,
    target: str,
    token: str | None,
    stop_flag: Any = None,
    parent: int | None = None,
    bell: Any = None,
) -> None:
    """The job process's loop. ``stop_flag`` is the worker's shared stop flag (a
    ``multiprocessing`` ``RawValue``; None: never set). ``parent``: the worker's pid; the
    process and the command it runs then die with the worker (Linux, see
    :mod:`.lifeline`; None: they do not). ``bell``: the write end of the pipe the parent
    waits on (see :class:`_Sent`; None: it waits on this one)."""
    if parent is not None:  # (first: the worker may be gone already)
        die_with_parent(parent)
        groups = CommandGroups.watched()
    else:
        groups = CommandGroups()
    import importlib
    import resource

    from .. import data
    from .execute import Executor

    opened: list[Dispatch] = []

    def stopped() -> bool:
        return stop_flag is not None and bool(stop_flag.value)

    def job_plane() -> Dispatch:
        """The worker's plane, opened by this job process on first use (dls.data, or a
        large argument blob its parent left for it to read)."""
        if not opened:
            if target == ":memory:":
                raise RuntimeError(
                    "dls.data inside a process worker needs a plane the job can reach: "
                    "a plane file or a URL, not ':memory:'"
                )  # (argument blobs of a ':memory:' plane come from the parent)
            opened.append(Dispatch(target, token=token))
        return opened[0]

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    keep_freed_memory()
    for name in imports:
        importlib.import_module(name)
    conn = Pipe(conn)
    pipe = _Sent(conn, None if bell is None else Pipe(bell))
    out, err = _Capture(pipe, "stdout"), _Capture(pipe, "stderr")
    sys.stdout, sys.stderr = out, err
    source = _Blobs(inline_limit, job_plane)
    executor = Executor(source)
    inbox: deque[tuple[Any, ...]] = deque()
    skipped: set[str] = set()
    bodies: set[str] = set()
    while True:
        try:
            # Read all that came (a skip may follow the run it cancels), then take one.
            if not inbox:
                inbox.append(conn.recv())
            while conn.ready():
                inbox.append(conn.recv())
        except EOFError:
            return
        waiting: set[str] = set()  # runs read before each skip (the parent sent those first)
        for m in list(inbox):
            if m[0] == "run":
                waiting.add(m[1].id)
            elif m[0] == "skip":
                inbox.remove(m)
                # It cancels a run still waiting here; one for a job that already ran
                # was answered by that job's "done" (and must not skip a later retry).
                if m[1] in waiting:
                    skipped.add(m[1])
        if not inbox:
            continue
        msg = inbox.popleft()
        if msg[0] == "stop":
            return
        if msg[0] == "claim":
            claims = _claim_here(job_plane, msg, pipe, stopped)
            if claims:
                inbox.appendleft(("run", claims[0], {}, msg[6] and len(claims) == 1))
            continue
        _, claim, blobs, alone = msg
        fn = fn_of(claim) if blobs else None
        if fn is not None and fn in blobs:
            bodies.add(fn)  # the parent sends a body once: keep it even if this is skipped
        source.blobs.update(blobs)
        if claim.id in skipped:
            skipped.discard(claim.id)
            pipe.send(("skipped", claim.id))
            continue
        job = claim.id
        out.job = err.job = job
        out.wrote = err.wrote = False
        told: list[bool] = []  # output or progress went to the parent for this job

        def on_output(stream: str, text: str, job: str = job, told: list[bool] = told) -> None:
            told.append(True)
            pipe.send(("out", job, stream, text))

        def on_spawn(pid: int, job: str = job) -> None:
            groups.running(pid)
            pipe.send(("pgid", job, pid))

        def on_progress(
            fraction: float, message: str | None, job: str = job, told: list[bool] = told
        ) -> None:
            told.append(True)
            pipe.send(("progress", job, fraction, message))

        with data.using(job_plane):
            outcome = executor.run(
                claim, on_output=on_output, on_spawn=on_spawn, progress=on_progress
            )
        groups.ended()
        out.flush()
        err.flush()
        out.job = err.job = None
        reported, took = False, None
        if alone and not (told or out.wrote or err.wrote) and _completes_here(outcome):
            pipe.send(("finishing", job), quiet=True)  # (read before any kill: _enforce)
            first = not opened
            started = time.monotonic()
            reported = _complete_here(job_plane, claim, outcome)
            if reported and not first:  # (the first opened the connection: not a sample)
                took = time.monotonic() - started
        for digest in [d for d in source.blobs if d not in bodies]:
            source.blobs.pop(digest, None)  # argument blobs go; function bodies stay
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        pipe.send(("done", job, outcome, rss_mb, reported, took))


def _claim_here(
    plane: Callable[[], Dispatch], msg: tuple[Any, ...], pipe: _Sent, stopped: Callable[[], bool]
) -> list[Claim]:
    """Make the worker's claim the parent asked for, and tell the parent what it leased
    before anything else (from then on the parent owns those leases). Returns the
    claims to run here: none once the worker is stopping (``stopped()``)."""
    _, queues, worker, limit, wait, lease_seconds, _alone, quiet = msg
    try:
        claims = plane().transport.claim(
            queues, worker, limit=limit, wait=wait, lease_seconds=lease_seconds,
            should_stop=stopped,
        )  # fmt: skip
    except Exception as exc:  # (the parent logs it and asks again later)
        pipe.send(("claimed", [], f"{type(exc).__name__}: {exc}", False))
        return []
    stopping = stopped()
    # (quiet where the parent said nothing waits on the word: it owns the leases once it
    # reads it, which it does before it acts on this process's end, see _died)
    word = ("claimed", claims, None, not stopping, time.monotonic())  # (one clock: Linux)
    pipe.send(word, quiet=quiet and len(claims) == 1 and not stopping)
    return [] if stopping else claims


def _completes_here(outcome: Outcome) -> bool:
    """Whether this process may complete the job itself: it ended well, without a
    data manifest to check or result blobs to upload."""
    return outcome.ok and outcome.manifest is None and not outcome.blobs


def _complete_here(plane: Callable[[], Dispatch], claim: Claim, outcome: Outcome) -> bool:
    """Complete the claim on the plane from this process. True once the plane answered
    (accepting it, or refusing it: a lease taken back is its decision); False leaves the
    report to the parent: not sent, no answer, or a result refused as unreadable."""
    try:
        (refusal,) = plane().transport.complete_many(
            [(claim.id, claim.lease_token, outcome.result or b"")]
        )
    except Exception:  # (whatever it was, the parent's report is the fallback)
        return False
    return not isinstance(refusal, InvalidRequest)


def fn_of(claim: Claim) -> str | None:
    try:
        env = decode_payload(claim.payload)
    except LakeshoreError:
        return None
    fn = env.get("fn")
    return fn if isinstance(fn, str) else None
