"""Wake-ups: claim waits and result watches without sleep-polling in one process.

Writes made through this plane object notify at once. When the store is shared with
other processes (a SQLite file, DynamoDB), one poller thread per plane watches the
store's change marker every ``store.poll_interval`` seconds while anybody waits, and
wakes them on a change. A store that can tell of writes to it (a SQLite file on Linux:
:class:`~.store.WatchesWrites`) lets the poller sleep until a write by any process, look
at its pace for a moment (:data:`LINGER_LOOKS`), and sleep again: an idle worker on a
plane file then costs nothing, and another process's commit is seen at once instead of
at the next look. Elsewhere, after :data:`QUIET` seconds without a change seen or made
here, it looks ever less often, up to every :data:`SLOW_POLL` seconds; a write made here
puts it back to its pace at once. (A store whose own pace is slower, DynamoDB's, keeps
it.)

A thread in :meth:`Changes.parking` never blocks here: a wait records what it would wait
for (a :class:`Park`) and returns False, and the plane call answers as if its time were
up. An event loop uses this to hold a claim or a result wait without a thread: it keeps
the request, is told of every change (:meth:`Changes.subscribe`) and asks again when the
park's condition has changed (``lakeshore serve``).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .model import FINISHED, Invocation
from .store import Store, WatchesWrites, WriteSignal

if TYPE_CHECKING:
    from ..transport import Unwatch

__all__ = ["Changes", "Look", "Park", "Taker", "Watch", "due_watches"]

Callback = Callable[[Invocation], None]


class Watch:
    """One watch over some ids; it fires once per id (the plane's watches, and the SDK
    result poller's)."""

    __slots__ = ("callback", "fired")

    def __init__(self, callback: Callback) -> None:
        self.callback = callback
        self.fired: set[str] = set()

    def due(self, rec: Invocation) -> bool:
        """Whether ``rec`` fires this watch now (its id's first finish it hears of);
        from here on it has."""
        if rec.id in self.fired:
            return False
        self.fired.add(rec.id)
        return True


def due_watches(
    records: Iterable[Invocation], take: Callable[[str], Iterable[Watch]]
) -> list[tuple[Watch, Invocation]]:
    """The (watch, record) pairs the finished ``records`` fire, each record's watches
    taken off their books by ``take(id)`` (unfinished records are left alone)."""
    due: list[tuple[Watch, Invocation]] = []
    for rec in records:
        if rec.state in FINISHED:
            due.extend((entry, rec) for entry in take(rec.id) if entry.due(rec))
    return due


class Look:
    """A blocking claim's look at the store, from :meth:`Changes.look` to its wait
    (:meth:`Changes.wait`) or its end (:meth:`Changes.looked`): a submit made meanwhile
    may leave one of its wakes to it (the claim sees the new generation as its wait
    begins and looks again, instead of a sleeping claim being woken to race it). The
    claim's next look then owes that wake: unless it takes one of that submit's records,
    it wakes a sleeping claim (it may have taken other work, or none of its queues')."""

    __slots__ = ("generation", "owes")

    def __init__(self, generation: int, owes: frozenset[str] | None = None) -> None:
        #: the generation when the look began (what the claim waits past)
        self.generation = generation
        #: the ids of the submit that left a wake to this look, or to the one before it
        self.owes = owes


class Taker:
    """A claim waiting for work that a lone submit may hand its new record to: the
    submit writes it already leased to :attr:`worker`, puts the claim in :attr:`box` and
    wakes the claim (:meth:`Changes.handed`), so it is answered without looking at the
    store again. Only while nothing a look would see differently has happened since the
    claim looked (:meth:`Changes.reserve`).

    Two kinds: a parked claim (see :meth:`Changes.claimant`), handed records only by a
    submit on its holder's own thread (the event loop's: between a hand-over and its
    delivery nothing else runs there) while the holder holds the park
    (:meth:`Changes.hold` to :meth:`Changes.unhold`), and woken by :attr:`on_handed`;
    and a claim blocking in a thread (:meth:`Changes.wait`), handed records by a submit
    on any thread of the process, which sleeps on a wake of its own (:attr:`sleeper`)
    until it has one or something changed, and leaves only once no submit is writing a
    record for it (:attr:`reserved`), or gives up on one that takes too long
    (:attr:`abandoned`: that submit hands its record back)."""

    __slots__ = (
        "abandoned",
        "box",
        "due",
        "lease_seconds",
        "marker",
        "on_handed",
        "queues",
        "reserved",
        "since",
        "sleeper",
        "thread",
        "worker",
    )

    def __init__(
        self,
        queues: frozenset[str],
        worker: str,
        lease_seconds: float,
        since: int,
        due: float,
        marker: Any,
    ) -> None:
        self.queues = queues
        self.worker = worker
        self.lease_seconds = lease_seconds
        #: the generation the claim's look began at, the plane time the earliest work it
        #: saw scheduled comes due (inf: none), and the store's change marker before the
        #: look (None: a store only this process writes)
        self.since = since
        self.due = due
        self.marker = marker
        #: the claims handed over (to answer, or to hand back if the answer cannot go)
        self.box: list[Any] = []
        #: called on the handing thread once a claim is in the box (the holder's wake)
        self.on_handed: Callable[[], None] | None = None
        #: the thread the park is held on (set by :meth:`Changes.hold`); ANY_THREAD for
        #: a claim blocking in a thread; 0 once neither (never handed records again)
        self.thread = 0
        #: a blocking claim's wait (None: a parked claim)
        self.sleeper: _Sleeper | None = None
        #: a submit took it off the books (:meth:`Changes.reserve`) and has not said
        #: yet whether it handed it a record (:meth:`Changes.handed`)
        self.reserved = False
        #: a blocking claim that left without that word: what the submit hands it is
        #: not its answer (the submit hands it back)
        self.abandoned = False


class _Sleeper:
    """A claim wait blocking in a thread (:meth:`Changes.wait`): it sleeps on a wake of its
    own, on the lock of :class:`Changes`, so that a wake reaches the one wait it is for
    (:meth:`Changes._wake_claims`, oldest first; :meth:`Changes.handed`)."""

    __slots__ = ("finishes", "wake")

    def __init__(self, wake: threading.Condition, finishes: bool) -> None:
        self.wake = wake
        #: a claim a finish may unblock (capped queues)
        self.finishes = finishes


#: :attr:`Taker.thread` of a claim blocking in a thread: a submit on any thread may hand
#: it a record
ANY_THREAD = -1


@dataclass(frozen=True)
class Park:
    """What a wait in a parking thread would have waited for."""

    #: "generation" (new work: claims) or "finishes" (a record finished: result waits)
    kind: str
    #: the counter's value the wait started from: any other value is a change
    since: int
    #: seconds until the plane wants to look again even without a change
    timeout: float
    #: the monotonic time the whole wait ends (the request's own deadline)
    until: float
    #: a claim on a capped queue: a finish may free a slot for it
    finishes: bool = False
    #: the queues a claim waits on (empty: not known)
    queues: frozenset[str] = frozenset()
    #: for a claim a finish may unblock: the finish count before its look (a finish
    #: since is a change, even one made before the park was held)
    finish_since: int | None = None
    #: a result wait's finished records, delivered by a watch that stays registered
    #: while the request is parked (see :meth:`Changes.keep`); None for other parks
    box: list[Invocation] | None = field(default=None, compare=False)
    #: removes that watch; the holder calls it once it is done with the park
    release: Callable[[], None] | None = field(default=None, compare=False)
    #: the request's whole answer made from the box's records, as each layer above the
    #: plane would have made it (see :meth:`Changes.then`); None: resolve it again
    answer: Callable[[list[Invocation]], Any] | None = field(default=None, compare=False)
    #: a claim a submit may hand its records to while it is held (see :class:`Taker`);
    #: its box is :attr:`box`
    taker: Taker | None = field(default=None, compare=False)

    def settled(self) -> Any:
        """The answer from the box, if it has records and the park can make one; None
        otherwise (the holder then resolves the request again)."""
        if self.box and self.answer is not None:
            return self.answer(list(self.box))
        return None


class _Parking(threading.local):
    on = False
    park: Park | None = None
    #: the queues of the work a claim took in the block (see Changes.took)
    took: frozenset[str] = frozenset()


class Parked:
    """What :meth:`Changes.parking` yields: called, the block's last park (None: the
    call answered without wanting to wait); :attr:`took`, the queues a claim in the
    block took work from."""

    def __init__(self, slot: _Parking) -> None:
        self._slot = slot
        self._park: Park | None = None
        self._took: frozenset[str] = frozenset()
        self._open = True

    def __call__(self) -> Park | None:
        return self._slot.park if self._open else self._park

    @property
    def took(self) -> frozenset[str]:
        return self._slot.took if self._open else self._took

    def _close(self) -> None:
        self._park, self._took, self._open = self._slot.park, self._slot.took, False


#: seconds without a change after which the poller slows down, and its slowest pace
#: (or the store's own, if longer): where the store cannot tell of writes
QUIET = 30.0
SLOW_POLL = 0.025
#: where it can (a plane file on Linux, see WatchesWrites): after a write is told, the
#: poller looks at its pace for LINGER_LOOKS paces (at least MIN_LINGER seconds, or the
#: watch's ``settle``, 1 s for a file whose commits sync: a commit is told at its first
#: write to the log and seen once it is whole), then sleeps until the next write — and
#: looks all the same every WATCH_SAFETY seconds while anybody waits
LINGER_LOOKS = 25
MIN_LINGER = 0.05
WATCH_SAFETY = 0.5
#: a poller whose pace is under this (an embedded plane file's 2 ms) looks as soon as a
#: write is told while lingering; a slower one (``lakeshore serve``'s 50 ms: its own
#: writes are most of the file's) keeps its pace
PROMPT_BELOW = 0.01
#: seconds after a told write that found no change before that poller looks again,
#: unless another write is told first (then at its pace)
RETRY = 0.001
#: seconds the poller lingers once nobody waits (or 500 paces, if longer)
IDLE_EXIT = 1.0

#: seconds a blocking claim leaving its wait waits at most for a submit that reserved it
#: to say whether it handed it a record (it takes one write; past that, the submit hands
#: the record back)
_RESERVED_WAIT = 30.0
#: seconds a wait blocking in a thread goes without looking again (a parked one is
#: looked at again on a change, or when its work comes due)
LOOK_AGAIN = 0.25
#: ... and a parked one at least this often all the same, should a change slip past it
PARKED_LOOK = 5.0
#: most ids kept as submitted here and not yet finished (see :meth:`Changes.fresh`)
FRESH_IDS = 100_000
#: most sets of queues whose last look is kept (see :meth:`Changes.drained`)
_DRAINED_KEYS = 64


@dataclass(frozen=True)
class _Drained:
    """A look that left nothing to take on its queues (see :meth:`Changes.drained`)."""

    #: the generation it began at
    generation: int
    #: plane time the earliest scheduled record on them comes due (inf: none)
    due: float
    #: monotonic time of the look
    at: float


class Changes:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._poll_interval = store.poll_interval
        lock = self._lock = threading.RLock()
        self._cond = threading.Condition(lock)
        #: the cross-process poller sleeps on this one (same lock): only a close cuts its
        #: nap short, not every finish the result waits on ``_cond`` are told of
        self._nap = threading.Condition(lock)
        self._generation = 0
        self._waiters = 0
        #: blocking claims looking at the store now (see :class:`Look`)
        self._looks: list[Look] = []
        #: parked claims held now that a submit on their holder's thread may hand its
        #: records to, and claims blocking in a thread that any submit may (see
        #: :class:`Taker`), oldest first
        self._takers: list[Taker] = []
        #: claim waits blocking in a thread, asleep and not woken since they went to
        #: sleep, oldest first (one woken that sleeps again goes to the end, as on a
        #: condition); a wake meant for one of them is never taken by a result wait
        self._sleepers: list[_Sleeper] = []
        #: claim waiters that a finish may unblock (capped queues)
        self._finish_waiters = 0
        #: finishes seen so far (what :meth:`wait_finish` waits on), and its waiters
        self._finishes = 0
        self._finish_listeners = 0
        self._watches: dict[str, list[Watch]] = defaultdict(list)
        self._poller: threading.Thread | None = None
        #: when this process last wrote (a change elsewhere is likely to follow), and
        #: whether the poller is napping longer than its pace
        self._active = 0.0
        self._slow = False
        #: whether the running poller has taken its first look (see :attr:`polling`)
        self._looked = False
        #: the watch of the store's writes the running poller sleeps on, if any
        self._watch: WriteSignal | None = None
        self._closed = False
        self._parking = _Parking()
        #: callbacks told of every change (parked requests); see :meth:`subscribe`
        self._subscribers: list[Callable[[int | None, frozenset[str]], None]] = []
        #: on a store no other process writes, the ids of records submitted through this
        #: plane whose finish it has not told (see :meth:`fresh`)
        self._fresh: set[str] = set()
        #: finishes and removals told so far (see :meth:`submitted`)
        self._told = 0
        #: on a store no other process writes, the last look that found some queues with
        #: nothing to take, by queues (see :meth:`drained`); and the generation of the
        #: last change that may have added work coming due later
        self._drained: dict[tuple[str, ...], _Drained] = {}
        self._later = 0

    # --- generic wake-ups --------------------------------------------------------
    @property
    def generation(self) -> int:
        return self._generation

    def notify(
        self,
        waiters: int | None = None,
        queues: Iterable[str] = (),
        ids: Iterable[str] | None = None,
        *,
        due_now: bool = False,
    ) -> None:
        """A change: new work, or anything a claim wait may be waiting for. With
        ``waiters`` (a submit of that many records) only that many claim waits are woken
        at once; one that finds nothing for it passes the wake on (:meth:`pass_on`), so
        one new job does not wake every idle worker of the process to look for it.
        ``queues`` names the queues the new work is on, when known (subscribers use it
        to wake only parked claims on them); ``ids``, the new records' ids, lets a claim
        looking at the store now take a wake (see :class:`Look`). ``due_now``: the change
        added no work that comes due later (a submit of calls due at once); any other may
        have (see :meth:`drained`)."""
        with self._cond:
            self._generation += 1
            if not due_now:
                self._later = self._generation
            if waiters is None:
                self._wake_claims(None)
            else:
                # A claim looking now sees the change when it is done and looks again:
                # it takes the wake a sleeping one would have had (woken, that one would
                # only race it, and the loser look for nothing).
                left = waiters
                if ids is not None and self._looks:
                    owed = frozenset(ids)
                    for look in self._looks:
                        if left == 0:
                            break
                        if look.owes is None:
                            look.owes, left = owed, left - 1
                if left:
                    self._wake_claims(left)
            self._stir()
        self._tell(waiters, frozenset(queues))

    def look(self, owes: frozenset[str] | None = None) -> Look | None:
        """A blocking claim begins a look at the store (None while parking: a parked
        claim's wakes come from its holder, see :meth:`subscribe`); ``owes``: the wake
        its last look took (what :meth:`wait` answered)."""
        if self._parking.on:
            return None
        with self._cond:
            look = Look(self._generation, owes)
            self._looks.append(look)
        return look

    def looked(self, look: Look | None, took: Iterable[str] = ()) -> None:
        """The look is done and the claim will not wait (it took the records ``took``,
        its time is up, it failed): a wake left to it goes to a sleeping claim, unless
        it took one of that submit's records. (A claim that waits hands its look to
        :meth:`wait` instead.)"""
        if look is None:
            return
        with self._cond:
            if look not in self._looks:
                return  # (a wait ended it, then failed)
            self._looks.remove(look)
            if look.owes is not None and look.owes.isdisjoint(took) and self._waiters:
                self._wake_claims(1)

    def _wake_claims(self, n: int | None, *, finishes: bool = False) -> None:
        """Wake ``n`` claim waits asleep (None: all), oldest first (lock held); with
        ``finishes``, every one a finish may unblock (and no other)."""
        if finishes:
            woken = [s for s in self._sleepers if s.finishes]
            self._sleepers = [s for s in self._sleepers if not s.finishes]
        elif n is None:
            woken, self._sleepers = self._sleepers, []
        else:
            woken, self._sleepers = self._sleepers[:n], self._sleepers[n:]
        for sleeper in woken:
            sleeper.wake.notify()

    def _stir(self) -> None:
        """A write made here (lock held): the poller keeps, or takes up again, its pace."""
        self._active = time.monotonic()
        if self._slow:
            self._nap.notify_all()

    def pass_on(self, look: Look | None = None) -> None:
        """A woken claim wait found nothing (its queues had no new work): wake the next
        waiter that has not seen the change yet (one that has goes back to sleep). With
        the claim's ``look``: a wake the look owed is this one (see :class:`Look`)."""
        with self._cond:
            if look is not None:
                look.owes = None
            if self._waiters:
                self._wake_claims(1)

    def drained(
        self, queues: Iterable[str], generation: int, now: float, due: float | None
    ) -> None:
        """A claim's look, begun at ``generation`` and at plane time ``now``, left nothing
        it could take now on ``queues`` (it found nothing, or leased the last of it).
        ``due`` is when their earliest scheduled record comes due (plane time; inf: none);
        None when the look did not read it: it is carried over from the last such look,
        if no change told since may have added work coming due later (a submit of calls
        due at once does not) and that time has not come.

        On a store no other process writes (every change is told here), a claim's look
        at the same queues is then left out while nothing new is told, until that time
        comes or :data:`LOOK_AGAIN` passes (see :meth:`drained_until`): a worker that
        has just finished a job waits at once, instead of first reading an empty queue
        and its next due time (two statements, each of which lets go of the GIL)."""
        if self._store.shared:
            return
        key = tuple(queues)
        with self._cond:
            if due is None:
                last = self._drained.get(key)
                if last is None or self._later > last.generation or last.due <= now:
                    self._drained.pop(key, None)
                    return
                due = last.due
            if len(self._drained) >= _DRAINED_KEYS and key not in self._drained:
                self._drained.clear()
            self._drained[key] = _Drained(generation, due, time.monotonic())

    def drained_until(self, queues: Iterable[str], generation: int, now: float) -> float | None:
        """When scheduled work on ``queues`` comes due (plane time; inf: none), if a look
        at generation ``generation`` may be left out (see :meth:`drained`); None: look.
        Nothing may have changed since that generation either (a sweep the claim made
        after reading it may have handed a lease back)."""
        last = self._drained.get(tuple(queues)) if self._drained else None
        if (
            last is None
            or last.generation != generation
            or self._generation != generation
            or now >= last.due
            or time.monotonic() - last.at >= LOOK_AGAIN
        ):
            return None
        return last.due

    def wait(
        self,
        since: int,
        timeout: float,
        *,
        finishes: bool = False,
        until: float | None = None,
        queues: Iterable[str] = (),
        parked: float | None = None,
        finish_since: int | None = None,
        look: Look | None = None,
        taker: Taker | None = None,
    ) -> bool:
        """Block until something changed after generation ``since``, or ``timeout``.

        A finish (a record reaching a finished state) wakes only waiters that ask for
        ``finishes`` (claims on capped queues, which a finish may unblock): a claim wait
        on work to arrive is not woken by every job that ends. ``until`` is when the
        caller's whole wait ends (its loop's deadline). False when the calling thread is
        parking: nothing was waited for, and the caller answers now; ``parked`` is then
        the park's timeout instead of ``timeout``. With ``finishes``, ``finish_since`` is
        the finish count read before the caller looked: a finish since is a change.
        ``look`` is the caller's :class:`Look`, ended here as the wait begins: a wake
        left to it is a change since ``since``, and the caller looks again at once, its
        next look owing the wake (``look.owes``, read after this returns). A look that
        found nothing is owed nothing more: its claim passed a wake on (:meth:`pass_on`).
        ``taker``: a claim whose look found its queues with nothing to take, which a
        submit may hand its record to meanwhile (see :class:`Taker`; not one a finish
        may unblock, nor a parking one): the wait then ends when its box has claims too.
        """
        since_finish = finish_since if finishes else None
        if self._parking.on:
            nap = timeout if parked is None else parked
            return self._park(
                "generation", since, nap, until, finishes, frozenset(queues), since_finish
            )

        def moved() -> bool:
            return (
                self._generation != since
                or self._closed
                or (since_finish is not None and self._finishes != since_finish)
            )

        with self._cond:
            if look is not None:
                self._looks.remove(look)
            if moved():
                return True
            self._count("generation", finishes, 1)
            self._ensure_poller()
            try:
                self._sleep(moved, timeout, finishes, taker)
            finally:
                self._count("generation", finishes, -1)
        return True

    def _sleep(
        self, moved: Callable[[], bool], timeout: float, finishes: bool, taker: Taker | None
    ) -> None:
        """A claim wait blocking in this thread (lock held): it sleeps on a wake of its own
        until ``moved()``, its box has claims (``taker``: on the books meanwhile), or
        ``timeout``. Woken for nothing, it sleeps again at the end of the line, as on a
        condition; not on the line while a submit that reserved it writes (that submit
        wakes it). It leaves a taker's books, and not while that submit writes (the
        record is leased to its worker: a claim gone would leave it held until its
        lease ran out) — unless the write takes past :data:`_RESERVED_WAIT`."""
        sleeper = _Sleeper(threading.Condition(self._lock), finishes)
        if taker is not None:
            taker.sleeper, taker.thread = sleeper, ANY_THREAD
            self._takers.append(taker)
        end = time.monotonic() + timeout
        try:
            while not ((taker is not None and taker.box) or moved()):
                left = end - time.monotonic()
                if left <= 0:
                    break
                if sleeper not in self._sleepers and not (taker is not None and taker.reserved):
                    self._sleepers.append(sleeper)
                sleeper.wake.wait(left)
        finally:
            try:
                if sleeper in self._sleepers:
                    self._sleepers.remove(sleeper)
                if taker is not None:
                    taker.thread = 0  # (never back on the books)
                    if taker in self._takers:
                        self._takers.remove(taker)
                    sleeper.wake.wait_for(lambda: not taker.reserved, _RESERVED_WAIT)
            finally:
                if taker is not None and taker.reserved:
                    taker.abandoned = True  # (decided with the lock held: see handed)

    @property
    def finishes(self) -> int:
        return self._finishes

    def wait_finish(
        self,
        since: int,
        timeout: float,
        *,
        until: float | None = None,
        parked: float | None = None,
    ) -> bool:
        """Block until some record finished after count ``since`` (any record: the
        caller looks for its own), or ``timeout``, or the plane closes. False when the
        calling thread is parking (nothing was waited for); ``parked`` is then the
        park's timeout instead of ``timeout``."""
        if self._parking.on:
            return self._park("finishes", since, timeout if parked is None else parked, until)
        with self._cond:
            if self._finishes != since:
                return True
            self._count("finishes", False, 1)
            self._ensure_poller()
            try:
                self._cond.wait_for(lambda: self._finishes != since or self._closed, timeout)
            finally:
                self._count("finishes", False, -1)
        return True

    # --- parking: waits held by an event loop instead of a thread -------------------
    @property
    def parks(self) -> bool:
        """Whether the calling thread parks instead of blocking."""
        return self._parking.on

    @contextmanager
    def parking(self) -> Iterator[Parked]:
        """While the block runs, waits in this thread record a :class:`Park` and return
        at once; yields a :class:`Parked` giving the last park (None: the call answered
        without wanting to wait) and the queues a claim took work from."""
        slot = self._parking
        slot.on, slot.park, slot.took = True, None, frozenset()
        parked = Parked(slot)
        try:
            yield parked
        finally:
            # (the thread keeps no park past the block: a kept watch's records with it)
            parked._close()
            slot.park, slot.on, slot.took = None, False, frozenset()

    def took(self, queues: Iterable[str]) -> None:
        """A claim in a :meth:`parking` block took work from ``queues`` (a no-op
        outside one): a parked claim's holder passes on a wake it did not use."""
        slot = self._parking
        if slot.on:
            slot.took = slot.took | frozenset(queues)

    def _park(
        self,
        kind: str,
        since: int,
        timeout: float,
        until: float | None,
        finishes: bool = False,
        queues: frozenset[str] = frozenset(),
        finish_since: int | None = None,
    ) -> bool:
        """Record what this thread's wait would wait for (its nap ``timeout``, at most
        :data:`PARKED_LOOK`; its end ``until``); False: nothing was waited for."""
        end = time.monotonic() + timeout if until is None else until
        nap = min(max(0.0, timeout), PARKED_LOOK)
        self._parking.park = Park(kind, since, nap, end, finishes, queues, finish_since)
        return False

    def keep(self, box: list[Invocation], release: Callable[[], None]) -> None:
        """The last park of this thread keeps a result wait's watch: ``box`` is the list
        it fills, ``release`` removes it. Without a park the watch is released now."""
        slot = self._parking
        if slot.park is None:
            release()
            return
        slot.park = replace(slot.park, box=box, release=release, answer=lambda recs: recs)

    def claimant(
        self,
        worker: str,
        lease_seconds: float,
        due: float,
        marker: Any,
        hand_back: Callable[[list[Any]], None],
    ) -> None:
        """The last park of this thread is a claim a lone submit may hand its record to
        while it is held (see :class:`Taker`): not one a finish may unblock (a capped
        queue's: a cap is counted by the claim's own look). Its answer is made from the
        claims handed over (:meth:`then` wraps it as for a result wait); ``hand_back``
        gets those its holder could not deliver (the park's ``release``). ``due``: the
        plane time the earliest work the look saw scheduled comes due (inf: none);
        ``marker``: the store's change marker read before the claim looked, on a store
        other processes write (None elsewhere)."""
        slot = self._parking
        park = slot.park
        if not slot.on or park is None or park.kind != "generation" or park.finishes:
            return
        if not park.queues:
            return
        taker = Taker(park.queues, worker, lease_seconds, park.since, due, marker)
        box = taker.box

        def release() -> None:
            handed, box[:] = list(box), []
            if handed:
                hand_back(handed)

        slot.park = replace(park, box=box, release=release, answer=lambda got: got, taker=taker)

    @property
    def takers(self) -> bool:
        """Whether any parked claim may be handed records now (read without the lock:
        a hint; :meth:`reserve` decides)."""
        return bool(self._takers)

    def reserve(self, queue: str, now: float) -> Taker | None:
        """The oldest claim held on this thread that waits on ``queue``, taken off the
        books (a submit hands it its record, then :meth:`handed`); None: none may be
        handed one. A claim qualifies only while what its look saw still stands: no
        change told since (new work elsewhere, a hand-back, a retry, a resume: the
        claim is woken to look, and work older than the submit's may be pending), its
        scheduled work not come due by ``now`` (plane time), and no other process's
        write to the store since it looked (:meth:`~.store.Store.change_marker`)."""
        me = threading.get_ident()

        def eligible(t: Taker) -> bool:
            return (
                (t.thread == me or t.thread == ANY_THREAD)
                and queue in t.queues
                and t.since == self._generation
                and now < t.due
            )

        with self._cond:
            taker = None if self._closed else next(filter(eligible, self._takers), None)
        if taker is None:
            return None
        # (read outside the lock, the taker left in place: refused, nothing is disturbed)
        try:
            moved = taker.marker is not None and self._store.change_marker() != taker.marker
        except Exception:
            moved = True  # (the store is closing: nothing handed)
        if moved:
            return None  # (another process wrote: the claim looks, as woken)
        with self._cond:
            if taker not in self._takers or not eligible(taker) or self._closed:
                return None  # (it left, or something changed, meanwhile)
            self._takers.remove(taker)
            taker.reserved = True
            if taker.sleeper is not None and taker.sleeper in self._sleepers:
                self._sleepers.remove(taker.sleeper)  # (it takes no other wake meanwhile)
        return taker

    def withdraw(self, queue: str) -> None:
        """Claims parked for work on ``queue`` are handed nothing more (it was paused:
        their holders answer them as a look would, at their next)."""
        with self._cond:
            self._takers = [t for t in self._takers if queue not in t.queues]

    def handed(self, taker: Taker) -> bool:
        """The submit's record is written and the ``taker`` it reserved has its claim in
        its box: wake its holder. One that got none (the record was a replay of an
        existing id, or the write failed) goes back on the books, while it waits. False:
        a blocking claim that gave up waiting for this word (:attr:`Taker.abandoned`),
        whose box is not its answer: the caller hands what it put there back."""
        if taker.box and taker.on_handed is not None:
            taker.on_handed()
        with self._cond:
            if not taker.box and taker.thread and taker not in self._takers:
                self._takers.insert(0, taker)
            self._unreserve(taker)
            return not taker.abandoned

    @staticmethod
    def _unreserve(taker: Taker) -> None:
        """No submit writes for ``taker`` any more (lock held): a blocking claim is woken,
        to take its box, to leave, or to sleep on."""
        taker.reserved = False
        if taker.sleeper is not None:
            taker.sleeper.wake.notify()

    def then(
        self,
        wrap: Callable[[Callable[[list[Invocation]], Any]], Callable[[list[Invocation]], Any]],
    ) -> None:
        """Wrap the answer the last park of this thread makes from its box: a layer above
        the plane turns the records into its own answer (``wrap(inner) -> outer``).
        Nothing to do for a park without one."""
        slot = self._parking
        if slot.on and slot.park is not None and slot.park.answer is not None:
            slot.park = replace(slot.park, answer=wrap(slot.park.answer))

    def changed(self, park: Park) -> bool:
        """Whether what ``park`` waits for has happened (or the plane closed)."""
        now = self._generation if park.kind == "generation" else self._finishes
        if park.finish_since is not None and self._finishes != park.finish_since:
            return True  # (a claim a finish may unblock)
        return now != park.since or self._closed

    def hold(self, park: Park) -> None:
        """Count a parked request as a waiter (finishes and cross-process changes are
        then noticed for it) until :meth:`unhold`; a claim a submit may hand records to
        (:attr:`Park.taker`) is on the books meanwhile, for submits on this thread."""
        with self._cond:
            self._count(park.kind, park.finishes, 1)
            if park.taker is not None and not park.taker.box:
                park.taker.thread = threading.get_ident()
                self._takers.append(park.taker)
            self._ensure_poller()

    def unhold(self, park: Park) -> None:
        with self._cond:
            self._count(park.kind, park.finishes, -1)
            taker = park.taker
            if taker is not None:
                taker.thread = 0  # (no longer held: never put back on the books)
                if taker in self._takers:
                    self._takers.remove(taker)

    def _count(self, kind: str, finishes: bool, step: int) -> None:
        """Count a wait in or out (under the lock): a claim wait ("generation"), one a
        finish may unblock too (``finishes``), or a result wait ("finishes")."""
        if kind == "generation":
            self._waiters += step
            self._finish_waiters += step if finishes else 0
        else:
            self._finish_listeners += step

    def subscribe(
        self, callback: Callable[[int | None, frozenset[str]], None]
    ) -> Callable[[], None]:
        """Call ``callback(n, queues)`` (from the changing thread, outside any lock)
        after every change a wait could be waiting for; returns a function that
        unsubscribes. ``n`` is how many claim waits the change is worth waking (a
        submit's records, see :meth:`notify`; 0 for a finish that made no work), or None
        for all of them; ``queues`` the queues of that work when known (else empty) —
        for a finish (``n`` 0), the queues of the records that finished (a claim held
        back by a cap on another queue gains no slot from it). Result waits are woken by
        any finish."""
        with self._cond:
            self._subscribers = [*self._subscribers, callback]

        def unsubscribe() -> None:
            with self._cond:
                self._subscribers = [c for c in self._subscribers if c is not callback]

        return unsubscribe

    def _tell(self, waiters: int | None = None, queues: frozenset[str] = frozenset()) -> None:
        for callback in self._subscribers:
            callback(waiters, queues)

    # --- result watches ------------------------------------------------------------
    def watch(self, ids: Iterable[str], callback: Callback) -> Unwatch:
        entry = Watch(callback)
        ids = list(ids)
        with self._cond:
            for inv_id in ids:
                self._watches[inv_id].append(entry)
            self._ensure_poller()

        def unwatch(only: Iterable[str] | None = None, /) -> None:
            with self._cond:
                for inv_id in ids if only is None else only:
                    entries = self._watches.get(inv_id)
                    if entries and entry in entries:
                        entries.remove(entry)
                        if not entries:
                            del self._watches[inv_id]

        return unwatch

    @property
    def told(self) -> int:
        """How many times a finish or a removal was told: read it before a submit's
        write, and hand it to :meth:`submitted`."""
        return self._told

    def submitted(self, ids: Iterable[str], since: int) -> None:
        """Records of these ids were just written new through this plane. On a store no
        other process writes (every finish is then told here, see :meth:`finished`)
        they are known to exist, unfinished, until their finish is told — unless a
        finish or a removal was told since ``since`` (:attr:`told`, read before the
        write): it may have been one of theirs, told before they were kept here."""
        if self._store.shared:
            return
        with self._cond:
            if self._told == since and len(self._fresh) < FRESH_IDS:
                self._fresh.update(ids)

    def fresh(self, ids: Iterable[str]) -> bool:
        """Whether every one of ``ids`` exists and has not finished, as far as this plane
        knows without reading the store: submitted through it and its finish not told.
        A watch registered before asking hears of any finish after (its look at the
        store can be left out); one told before it made the answer False."""
        with self._cond:
            return all(inv_id in self._fresh for inv_id in ids)

    def removed(self) -> None:
        """Records were deleted (a queue with its invocations): what :meth:`fresh` knew
        may be gone."""
        with self._cond:
            self._told += 1
            self._fresh.clear()

    def deliver(self, records: Iterable[Invocation]) -> None:
        """Fire the watches of records a look found finished (each watch fires once).
        Unlike :meth:`finished` this is no news: their finish was told when it happened,
        so nothing else is woken."""
        with self._cond:
            due = self._take_due(records)
        for entry, rec in due:
            entry.callback(rec)

    def _take_due(self, records: Iterable[Invocation]) -> list[tuple[Watch, Invocation]]:
        """The watches the finished ``records`` fire, taken off the books (lock held)."""
        return due_watches(records, lambda inv_id: self._watches.pop(inv_id, ()))

    def finished(self, records: Iterable[Invocation]) -> None:
        """Deliver finished records to their watchers (each watch fires once)."""
        records = list(records)
        with self._cond:
            self._told += 1
            if self._fresh:
                self._fresh.difference_update(rec.id for rec in records)
            due = self._take_due(records)
            # Records not finished (retried: pending again) are new work for claims: a
            # new generation. A claim held back by a cap watches the finish count (its
            # ``finish_since``), as a cursor wait does; other claim waits sleep on.
            new_work = any(rec.state not in FINISHED for rec in records)
            finish = any(rec.state in FINISHED for rec in records)
            self._stir()
            if finish:
                self._finishes += 1  # always: a cursor wait reads it before it looks
            if new_work:
                self._generation += 1
                self._later = self._generation  # (a retry comes due after its backoff)
            if new_work:
                self._wake_claims(None)
            elif finish and self._finish_waiters:
                self._wake_claims(None, finishes=True)
            if finish and self._finish_listeners > 0:
                self._cond.notify_all()
        for entry, rec in due:
            entry.callback(rec)
        if new_work:
            self._tell(None)
        elif finish:  # a finish alone is no work for claims, only a slot on its queues
            self._tell(0, frozenset(rec.queue for rec in records if rec.state in FINISHED))

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every waiter: the plane is going away (waits return empty)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._wake_claims(None)
            self._nap.notify_all()
            if self._watch is not None:
                self._watch.interrupt()  # (the poller may sleep on it: it ends now)
        self._tell()

    # --- cross-process polling -------------------------------------------------------
    def _ensure_poller(self) -> None:
        if not self._store.shared or self._closed:
            return
        if self._poller is None or not self._poller.is_alive():
            # (its first look counts as a change: see _poll)
            self._poller = threading.Thread(
                target=self._poll, name="lakeshore-changes", daemon=True
            )
            self._poller.start()

    @property
    def polling(self) -> bool:
        """Whether a poller watches the store and has taken its first look (which
        counts as a change: waiters woken by it have been told)."""
        poller = self._poller
        return poller is not None and poller.is_alive() and self._looked

    def _busy(self) -> bool:
        return not self._closed and (
            self._waiters > 0 or self._finish_listeners > 0 or bool(self._watches)
        )

    def _poll(self) -> None:
        # The first look is taken as a change: a commit made by another process after a
        # waiter looked and before this poller started (and read the marker) would
        # otherwise never be seen as one.
        marker = None
        self._looked = False
        pace = self._poll_interval
        slowest = max(pace, SLOW_POLL)
        nap = pace
        changed = idle_since = told = time.monotonic()
        try:
            watch = self._store.write_watch() if isinstance(self._store, WatchesWrites) else None
        except Exception:  # (the store was closed under us, or has no watch to give)
            watch = None
        linger = max(LINGER_LOOKS * pace, MIN_LINGER, watch.settle if watch else 0.0)
        with self._cond:
            self._watch = watch  # (close() interrupts a sleep on it)
        #: a write is told at the commit's first write to the log, and seen once the
        #: commit is whole: a look at once that finds nothing looks again at the next
        #: write told, or RETRY later
        retry = False
        try:
            while True:
                on_watch = False
                with self._cond:
                    now = time.monotonic()
                    if self._busy():
                        idle_since = now
                    elif self._closed or now - idle_since > max(IDLE_EXIT, 500 * pace):
                        self._poller = None
                        return
                    if watch is not None and marker is not None and now - told > linger:
                        on_watch = True  # nothing written lately: sleep until a write
                    elif watch is not None and marker is not None and pace < PROMPT_BELOW:
                        on_watch = True  # written lately: look at once on the next one
                    else:
                        self._slow = nap > pace
                        self._nap.wait(nap)
                        self._slow = False
                    lately = max(changed, self._active)
                if on_watch:
                    assert watch is not None
                    lingering = time.monotonic() - told <= linger
                    if watch.wait((RETRY if retry else nap) if lingering else WATCH_SAFETY):
                        told, retry = time.monotonic(), True
                    elif retry:
                        retry = False
                    elif not lingering and not self._busy():
                        continue  # (nobody waits: no look needed, only the idle clock)
                elif watch is not None and watch.written():
                    told = time.monotonic()
                try:
                    now_marker = self._store.change_marker()
                except Exception:  # the store was closed under us
                    return
                self._looked = True
                if now_marker == marker:
                    quiet = time.monotonic() - lately > QUIET
                    nap = min(nap * 2, slowest) if quiet else pace
                    continue
                marker = now_marker
                changed, nap, retry = time.monotonic(), pace, False
                # Take the watched ids only after reading the marker: a watch added since
                # checked its records itself, after this change was committed.
                with self._cond:
                    watched = list(self._watches)
                if watched:
                    self.finished(self._store_get_many(watched))
                with self._cond:  # another process wrote: maybe work, maybe a finish
                    self._finishes += 1
                self.notify()
        finally:
            if watch is not None:
                with self._cond:
                    if self._watch is watch:  # (not a poller's started since)
                        self._watch = None
                watch.close()

    def _store_get_many(self, ids: list[str]) -> list[Any]:
        return [r for r in self._store.get_many(ids) if r.state in FINISHED]
