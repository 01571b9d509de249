"""SQLite store: ``":memory:"`` for one process, a file for processes on one machine.

Every primitive is one short transaction. Compare-and-set updates are a single
``UPDATE … WHERE id = ? AND <expect> RETURNING *``, so two processes racing for the
same invocation cannot both win. A file plane runs in WAL mode with a busy timeout;
``durability="normal"`` (the default) survives a killed process, ``"full"`` also a
power loss, at the price of an fsync per commit. A file plane keeps content-addressed
blobs as files in ``<plane file>.blobs/`` (written whole, then renamed into place).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Literal

import msgpack

from ..plane.model import (
    FINISHED,
    DaemonRecord,
    Invocation,
    LogEntry,
    QueueSpec,
    RetryPolicy,
    State,
    TokenRecord,
)
from ..wire import is_digest
from .blobfiles import BlobFile, drop_stale_parts
from .filewatch import FileWatch, watch_file

__all__ = ["SqliteStore"]

#: states an invocation ends in (as stored)
_FINISHED_STATES = frozenset(s.value for s in FINISHED)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY,
    spec BLOB NOT NULL,
    created_at REAL NOT NULL,
    last_activity REAL NOT NULL,
    counter INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS invocations (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    payload BLOB,
    request_digest TEXT NOT NULL,
    order_key TEXT NOT NULL,
    priority REAL NOT NULL,
    available_at REAL NOT NULL,
    created_at REAL NOT NULL,
    max_attempts INTEGER NOT NULL,
    timeout REAL,
    retry BLOB,
    attempt INTEGER NOT NULL,
    lease_token TEXT,
    lease_expires_at REAL,
    worker TEXT,
    started_at REAL,
    finished_at REAL,
    expires_at REAL,
    result BLOB,
    error BLOB,
    progress REAL,
    progress_message TEXT
);
CREATE INDEX IF NOT EXISTS inv_pending ON invocations (queue, order_key)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS inv_leases ON invocations (lease_expires_at)
    WHERE state = 'running';
CREATE INDEX IF NOT EXISTS inv_queue_state ON invocations (queue, state);
CREATE INDEX IF NOT EXISTS inv_expires ON invocations (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS logs (
    invocation TEXT NOT NULL,
    seq INTEGER NOT NULL,
    stream TEXT NOT NULL,
    text TEXT NOT NULL,
    at REAL NOT NULL,
    attempt INTEGER NOT NULL,
    PRIMARY KEY (invocation, seq)
);
CREATE TABLE IF NOT EXISTS data_keys (
    key TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    doc BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS daemons (
    id TEXT PRIMARY KEY,
    doc BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (
    digest TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    created_at REAL NOT NULL
);
"""

#: the next number of the finish sequence, inside the write that takes it (writes are
#: serialised, so numbers follow commit order across threads and processes)
_LAST_FINISH = "SELECT coalesce(max(finish_seq), 0) FROM invocations WHERE finish_seq IS NOT NULL"
_NEXT_FINISH = f"(({_LAST_FINISH}) + 1)"

#: the oldest SQLite the store's statements run on (RETURNING came in 3.35)
MIN_SQLITE = (3, 35, 0)

#: seconds between looks for parts of blob files whose writer died
_PART_SWEEP = 3600.0

_COLUMNS = [f.name for f in fields(Invocation)]
_COLUMN_SET = frozenset(_COLUMNS)
_SELECT = ", ".join(_COLUMNS)


def _pack(value: Any) -> bytes:
    out: bytes = msgpack.packb(value, use_bin_type=True)
    return out


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def _to_column(name: str, value: Any) -> Any:
    if name == "state":
        return str(value)
    if name == "retry":
        return None if value is None else _pack(value.to_dict())
    if name == "error":
        return None if value is None else _pack(value)
    return value


_Shape = tuple[tuple[str, ...], bool, tuple[tuple[str, bool], ...]]


def _shape(expect: Mapping[str, Any], changes: Mapping[str, Any]) -> _Shape:
    """What an update's statement follows from: the fields it changes, whether it
    finishes the record, the fields it expects with whether each is null."""
    return (
        tuple(changes),
        changes.get("state") in FINISHED,
        tuple((c, v is None) for c, v in expect.items()),
    )


def _bound(expect: Mapping[str, Any], changes: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """An update's values for its statement: the new ones, and the expected ones that
    are not null (a null is matched with ``IS NULL``)."""
    return (
        [_to_column(c, v) for c, v in changes.items()],
        [_to_column(c, v) for c, v in expect.items() if v is not None],
    )


def _known_fields(changes: tuple[str, ...], expect: tuple[tuple[str, bool], ...]) -> None:
    unknown = ({c for c, _ in expect} | set(changes)) - _COLUMN_SET
    if unknown:
        raise ValueError(f"unknown invocation fields: {sorted(unknown)}")


@functools.lru_cache(maxsize=1024)
def _update_sql(
    changes: tuple[str, ...],
    finishes: bool,
    expect: tuple[tuple[str, bool], ...],
    capped: bool,
    deadline: bool,
) -> str:
    """The statement of an :meth:`SqliteStore.update_if` of this shape (kept by it): the
    fields it changes, whether it finishes the record, the fields it expects with
    whether each is null, and whether it has a running cap and a deadline."""
    _known_fields(changes, expect)
    sets = ", ".join(f"{c} = ?" for c in changes)
    if finishes:
        sets += f", finish_seq = {_NEXT_FINISH}"
    where = ["id = ?"]
    where.extend(f"{c} IS NULL" if null else f"{c} = ?" for c, null in expect)
    if capped:
        where.append(
            "(SELECT count(*) FROM invocations AS r"
            " WHERE r.queue = invocations.queue AND r.state = 'running') < ?"
        )
    if deadline:
        where.append("(timeout IS NULL OR started_at + timeout > ?)")
    return f"UPDATE invocations SET {sets} WHERE {' AND '.join(where)} RETURNING {_SELECT}"


#: ids of a wait few enough that reading their records whole (one statement) costs less
#: than finding the finished ones first (two)
_FEW = 8
#: the most records one batched update statement carries (each brings a few variables;
#: SQLite allows 32,766 a statement)
_BATCH_ROWS = 500


@functools.lru_cache(maxsize=256)
def _batch_update_sql(
    changes: tuple[str, ...],
    finishes: bool,
    expect: tuple[tuple[str, bool], ...],
    deadline: bool,
    rows: int,
) -> str:
    """One statement that applies ``rows`` updates of one shape (as :func:`_update_sql`,
    without a running cap), each on its own condition: ``UPDATE … FROM`` a table of
    values, a row per record (its ordinal, id, new values, expected values)."""
    _known_fields(changes, expect)
    matched = [c for c, null in expect if not null]
    names = ["n_", "id_"] + [f"c{i}" for i in range(len(changes))]
    names += [f"e{i}" for i in range(len(matched))]
    marks = "(" + ", ".join("?" * len(names)) + ")"
    sets = ", ".join(f"{c} = v.c{i}" for i, c in enumerate(changes))
    if finishes:
        # (distinct and rising in the batch's order, above every number taken before)
        sets += f", finish_seq = ({_LAST_FINISH}) + v.n_"
    where = ["invocations.id = v.id_"]
    where.extend(f"invocations.{c} IS NULL" for c, null in expect if null)
    where.extend(f"invocations.{c} = v.e{i}" for i, c in enumerate(matched))
    if deadline:
        where.append(
            "(invocations.timeout IS NULL OR invocations.started_at + invocations.timeout > ?)"
        )
    return (
        f"WITH v({', '.join(names)}) AS (VALUES {', '.join([marks] * rows)})"
        f" UPDATE invocations SET {sets} FROM v WHERE {' AND '.join(where)}"
        f" RETURNING {_SELECT}"
    )


def _rolled_back() -> sqlite3.OperationalError:
    """A :meth:`SqliteStore.transaction` that SQLite rolled back whole on an error (a
    full disk, an I/O error) its block went past: none of the block's writes stand."""
    return sqlite3.OperationalError(
        "the batch's transaction was rolled back by SQLite after an error: nothing of it"
        " was written"
    )


def _not_inserted(inv_id: str) -> ValueError:
    # (INSERT OR IGNORE also passes over a row that breaks a NOT NULL constraint)
    return ValueError(
        f"invocation {inv_id!r} was neither inserted nor found: a field it needs is empty"
    )


_STATE, _RETRY, _ERROR = (_COLUMNS.index(c) for c in ("state", "retry", "error"))
_STATES = {str(s): s for s in State}


def _from_row(row: Sequence[Any]) -> Invocation:
    # (positional: the columns are the record's fields in order; a few µs a row)
    values = list(row)
    values[_STATE] = _STATES[values[_STATE]]
    if values[_RETRY] is not None:
        values[_RETRY] = RetryPolicy(**_unpack(values[_RETRY]))
    if values[_ERROR] is not None:
        values[_ERROR] = _unpack(values[_ERROR])
    return Invocation(*values)


def _spec_to_blob(spec: QueueSpec) -> bytes:
    return _pack(spec.settings())


def _spec_from_blob(name: str, blob: bytes) -> QueueSpec:
    return QueueSpec(name=name, **_unpack(blob))


#: seconds between the background checkpointer's looks at the WAL
_CHECKPOINT_EVERY = 2.0
#: WAL pages past which a committing writer checkpoints itself (the thread fell behind)
_WRITER_CHECKPOINT_PAGES = 10_000


class _Checkpointer:
    """Copies a plane file's WAL into the file from a thread and a connection of its own.

    SQLite's default has the commit that takes the WAL past 1,000 pages copy it (several
    milliseconds, under the store's lock): one request in about a hundred waited for it.
    A PASSIVE checkpoint here runs beside readers and writers (the sqlite3 module lets go
    of the GIL while it works) and never waits for them. It runs when the WAL was written
    since the last look, every :data:`_CHECKPOINT_EVERY` seconds.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._wal = path + "-wal"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lakeshore-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        db: sqlite3.Connection | None = None
        seen = None
        try:
            while not self._stop.wait(_CHECKPOINT_EVERY):
                try:
                    st = os.stat(self._wal)
                except FileNotFoundError:
                    continue
                if (st.st_size, st.st_mtime_ns) == seen:
                    continue
                if db is None:
                    db = sqlite3.connect(self._path, timeout=30.0, isolation_level=None)
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error:
                    continue  # (the file went away, or is being replaced): look again later
                # The log as it was before: a commit that ended during the checkpoint
                # (which copied none of it) changes it, and the next look copies that.
                seen = (st.st_size, st.st_mtime_ns)
        finally:
            if db is not None:
                db.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


class SqliteStore:
    """A :class:`~dreamlake.lakeshore.plane.store.Store` on the stdlib's sqlite3.

    One connection per store object, guarded by a lock: SQLite serialises writers
    anyway, and one connection keeps ``":memory:"`` a single database.
    """

    def __init__(
        self,
        path: str | Path = ":memory:",
        *,
        durability: Literal["normal", "full"] = "normal",
    ) -> None:
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise RuntimeError(
                f"the SQLite store needs SQLite {'.'.join(map(str, MIN_SQLITE))} or newer"
                f" (RETURNING, UPDATE … FROM); this Python's sqlite3 has {sqlite3.sqlite_version}"
            )
        self.path = str(path)
        self.shared = self.path != ":memory:"
        self._blob_dir = Path(self.path + ".blobs") if self.shared else None
        self._home: tuple[str, str] | None = None
        #: when purge next looks for parts of blob files left by dead writers
        self._parts_due = 0.0
        self._full = durability == "full"
        self.poll_interval = 0.002
        if self.shared:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        #: > 0 while :meth:`transaction` holds one open (its thread holds the lock)
        self._depth = 0
        #: whether that block has begun its SQLite transaction (at its first write)
        self._begun = False
        #: queue specs read (every submit and claim reads its queue's), valid while the
        #: file's data_version stays what it was when they were read (other processes'
        #: commits move it); this store's own writes to a spec drop them
        self._specs: dict[str, QueueSpec] = {}
        self._specs_marker = -1
        self._db = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        self._checkpointer: _Checkpointer | None = None
        if self.shared:
            self._use_wal()
            self._db.execute(f"PRAGMA synchronous={durability.upper()}")
            # Copying the WAL into the file is the background thread's job: a commit that
            # checkpoints itself holds every request behind it for milliseconds. Writers
            # still do it past a high mark, should the thread fall behind.
            self._db.execute(f"PRAGMA wal_autocheckpoint={_WRITER_CHECKPOINT_PAGES}")
            self._checkpointer = _Checkpointer(self.path)
        self._db.execute("PRAGMA busy_timeout=30000")
        with self._tx():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self._db.execute(stmt)
            self._add_finish_seq()
            # A queue's running records are counted by inv_queue_state (queue, state),
            # which SQLite picks for it anyway: an index of them alone (older plane files
            # have one) only cost every claim, hand-over and finish a write (~11 µs of a
            # finish's ~76)
            self._db.execute("DROP INDEX IF EXISTS inv_running")

    def _add_finish_seq(self) -> None:
        """The finish sequence (a column older plane files lack): every write that
        finishes an invocation gives it the next number, so a wait can ask exactly for
        what finished after a cursor (:meth:`finished_since`)."""
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(invocations)")}
        if "finish_seq" not in columns:
            self._db.execute("ALTER TABLE invocations ADD COLUMN finish_seq INTEGER")
        self._db.execute(
            "CREATE INDEX IF NOT EXISTS inv_finish_seq ON invocations (finish_seq)"
            " WHERE finish_seq IS NOT NULL"
        )
        # what waits read before the sequence (one index less to write at every finish)
        self._db.execute("DROP INDEX IF EXISTS inv_finished")

    def _use_wal(self) -> None:
        """Switch the file to WAL (it stays so). Changing the journal mode does not wait
        on the busy timeout: when several processes open a new file at once, it is
        "database is locked" at once. So it reads the mode first (a file already in WAL
        needs no lock) and retries the switch for up to 30 s."""
        deadline = time.monotonic() + 30.0
        while True:
            try:
                mode = self._db.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    @contextmanager
    def _tx(self, *, single: bool = False) -> Iterator[sqlite3.Connection]:
        """A write transaction, taken at once (no lock upgrades, no deadlocks).

        With ``single`` the block writes with one statement, which SQLite applies and
        commits whole or not at all on its own: outside :meth:`transaction` it is that
        statement alone (a ``BEGIN``/``COMMIT`` around it would add two), inside one it
        is part of the enclosing transaction (no savepoint). Otherwise, inside
        :meth:`transaction` it is a savepoint of the enclosing transaction."""
        with self._lock:
            if single and not self._depth:
                yield self._db
                return
            if self._depth and not self._begun:
                self._db.execute("BEGIN IMMEDIATE")  # the group's first write
                self._begun = True
            elif self._depth and not self._db.in_transaction:
                raise _rolled_back()  # (not in autocommit: its writes would stand alone)
            if self._depth and single:
                yield self._db
                return
            if self._depth:
                self._depth += 1
                self._db.execute("SAVEPOINT step")
                try:
                    yield self._db
                except BaseException:
                    if self._db.in_transaction:  # (else SQLite rolled it all back: see below)
                        self._db.execute("ROLLBACK TO step")
                        self._db.execute("RELEASE step")
                    raise
                finally:
                    self._depth -= 1
                if not self._db.in_transaction:
                    raise _rolled_back()
                self._db.execute("RELEASE step")
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._commit()

    def _commit(self) -> None:
        """COMMIT (lock held); one that fails is rolled back, so the connection is never
        left inside a transaction whose writes no other connection sees."""
        try:
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group the writes of the block into one transaction (one commit): what a batch
        of completions or a claim of many takes. Each write inside is a savepoint that
        stands on its own, as without the block, so the block commits what succeeded
        even when it ends with an exception — unless SQLite rolled the whole transaction
        back on an error (a full disk, an I/O error, an interrupt): then nothing of it
        stands, a write after it raises instead of writing alone, and a block that went
        past the error raises at its end. A commit that fails is rolled back. Other
        threads wait for the block to end.

        The transaction begins at the block's first write: what the block reads before
        it reads as outside one (a claim that finds nothing takes no write lock and
        commits nothing); the writes are conditional, so a read they act on may be old."""
        with self._lock:
            if self._depth:
                yield
                return
            self._depth = 1
            ended = False
            try:
                yield
                ended = True
            finally:
                self._depth = 0
                if self._begun:
                    self._begun = False
                    if self._db.in_transaction:
                        self._commit()
                    elif ended:
                        raise _rolled_back()
                    # (else the error in flight is the one SQLite rolled back for)

    # --- queues -------------------------------------------------------------
    @contextmanager
    def _queues_tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on queue specs: the specs kept (see :meth:`get_queue`)
        are dropped after it, whether it committed or not."""
        try:
            with self._tx() as db:
                yield db
        finally:
            self._specs.clear()

    def put_queue(self, spec: QueueSpec, now: float) -> QueueSpec:
        with self._queues_tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO queues (name, spec, created_at, last_activity)"
                " VALUES (?, ?, ?, ?)",
                (spec.name, _spec_to_blob(spec), now, now),
            )
            row = db.execute("SELECT spec FROM queues WHERE name = ?", (spec.name,)).fetchone()
        return _spec_from_blob(spec.name, row[0])

    def get_queue(self, name: str) -> QueueSpec | None:
        if not self.shared:  # no other writer: a spec read stays right until we change it
            spec = self._specs.get(name)  # (a dict read needs no lock)
            if spec is not None:
                return spec
        with self._lock:
            if self.shared:
                marker = self.change_marker()
                if marker != self._specs_marker:
                    self._specs.clear()
                    self._specs_marker = marker
            spec = self._specs.get(name)
            if spec is not None:
                return spec
            row = self._db.execute("SELECT spec FROM queues WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            spec = self._specs[name] = _spec_from_blob(name, row[0])
            return spec

    def list_queues(self) -> list[tuple[QueueSpec, float]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, spec, last_activity FROM queues ORDER BY name"
            ).fetchall()
        return [(_spec_from_blob(n, s), a) for n, s, a in rows]

    def replace_queue(self, spec: QueueSpec, now: float) -> bool:
        with self._queues_tx() as db:
            cur = db.execute(
                "UPDATE queues SET spec = ?, last_activity = ? WHERE name = ?",
                (_spec_to_blob(spec), now, spec.name),
            )
        return cur.rowcount == 1

    def delete_queue(self, name: str, *, invocations: bool = True) -> int:
        with self._queues_tx() as db:
            gone = 0
            if invocations:
                db.execute(
                    "DELETE FROM logs WHERE invocation IN"
                    " (SELECT id FROM invocations WHERE queue = ?)",
                    (name,),
                )
                gone = db.execute("DELETE FROM invocations WHERE queue = ?", (name,)).rowcount
            db.execute("DELETE FROM queues WHERE name = ?", (name,))
        return gone

    def touch_queue(self, name: str, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE queues SET last_activity = ? WHERE name = ? AND last_activity < ?",
                (now, name, now),
            )

    def queue_counter(self, name: str, add: int) -> int:
        with self._tx() as db:
            row = db.execute(
                "UPDATE queues SET counter = counter + ? WHERE name = ? RETURNING counter",
                (add, name),
            ).fetchone()
        return 0 if row is None else int(row[0])

    # --- invocations --------------------------------------------------------
    def insert(self, inv: Invocation) -> Invocation | None:
        values = [_to_column(c, getattr(inv, c)) for c in _COLUMNS]
        marks = ", ".join("?" * len(_COLUMNS))
        seq = _NEXT_FINISH if inv.state in FINISHED else "NULL"
        for _ in range(2):
            with self._tx(single=True) as db:  # (one write; the SELECT only reads)
                cur = db.execute(
                    f"INSERT OR IGNORE INTO invocations ({_SELECT}, finish_seq)"
                    f" VALUES ({marks}, {seq})",
                    values,
                )
                if cur.rowcount == 1:
                    return None
                row = db.execute(
                    f"SELECT {_SELECT} FROM invocations WHERE id = ?", (inv.id,)
                ).fetchone()
            if row is not None:
                return _from_row(row)
            # (outside a transaction the record that stood in the way may have been
            # purged between the two statements: the insert is tried again)
        raise _not_inserted(inv.id)

    def get(self, inv_id: str) -> Invocation | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_SELECT} FROM invocations WHERE id = ?", (inv_id,)
            ).fetchone()
        return None if row is None else _from_row(row)

    def _select_in(self, sql: str, keys: Iterable[str]) -> list[Any]:
        """Rows of ``sql`` (with one ``IN ({})``) for distinct ``keys``, 500 at a time."""
        wanted = list(dict.fromkeys(keys))
        rows: list[Any] = []
        with self._lock:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                rows += self._db.execute(sql.format(", ".join("?" * len(chunk))), chunk).fetchall()
        return rows

    def get_many(self, ids: Sequence[str]) -> list[Invocation]:
        sql = f"SELECT {_SELECT} FROM invocations WHERE id IN ({{}})"
        return [_from_row(r) for r in self._select_in(sql, ids)]

    def finished_among(
        self, ids: Sequence[str]
    ) -> tuple[dict[str, float | None], list[Invocation]]:
        """Which of ``ids`` exist (id → ``expires_at``) and the records of the finished
        ones: what a wait on many ids needs, without decoding the unfinished records
        (a wait on a few reads their records whole, in one statement)."""
        if len(ids) <= _FEW:
            recs = self.get_many(ids)
            return {r.id: r.expires_at for r in recs}, [r for r in recs if r.state in FINISHED]
        rows = self._select_in(
            "SELECT id, state, expires_at FROM invocations WHERE id IN ({})", ids
        )
        known = {r[0]: r[2] for r in rows}
        done = [r[0] for r in rows if r[1] in _FINISHED_STATES]
        return known, self.get_many(done) if done else []

    def finish_cursor(self) -> int:
        """The finish sequence now: :meth:`finished_since` this number answers exactly
        what finishes after this call (writes take numbers in commit order)."""
        with self._lock:
            row = self._db.execute(_LAST_FINISH).fetchone()
        return int(row[0])

    def finished_since(self, ids: Sequence[str], since: float) -> list[Invocation]:
        """The records among ``ids`` that finished after cursor ``since`` (a
        :meth:`finish_cursor`): the cost follows what finished since, not ``len(ids)``."""
        wanted = set(ids)
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM invocations INDEXED BY inv_finish_seq WHERE finish_seq > ?",
                (since,),
            ).fetchall()
        hits = [r[0] for r in rows if r[0] in wanted]
        return [r for r in self.get_many(hits) if r.state in FINISHED] if hits else []

    def update_if(
        self,
        inv_id: str,
        expect: Mapping[str, Any],
        changes: Mapping[str, Any],
        *,
        running_below: int | None = None,
        deadline_after: float | None = None,
    ) -> Invocation | None:
        sql = _update_sql(
            *_shape(expect, changes), running_below is not None, deadline_after is not None
        )
        changed, expected = _bound(expect, changes)
        params: list[Any] = [*changed, inv_id, *expected]
        if running_below is not None:
            params.append(running_below)
        if deadline_after is not None:
            params.append(deadline_after)
        with self._tx(single=True) as db:
            # (every row read: the statement ends, and on its own commits, here)
            rows = db.execute(sql, params).fetchall()
        return _from_row(rows[0]) if rows else None

    def insert_many(self, invs: Sequence[Invocation]) -> list[Invocation | None]:
        if len(invs) == 1:
            return [self.insert(invs[0])]  # (one statement: no transaction around it)
        if any(inv.state in FINISHED for inv in invs) or len({i.id for i in invs}) < len(invs):
            # (a finished record takes a number of the finish sequence; an id twice must
            # find its first record: one statement each)
            with self.transaction():
                return [self.insert(inv) for inv in invs]
        marks = "(" + ", ".join("?" * len(_COLUMNS)) + ")"
        new: set[str] = set()
        with self.transaction():
            for start in range(0, len(invs), _BATCH_ROWS):
                chunk = invs[start : start + _BATCH_ROWS]
                values = [_to_column(c, getattr(inv, c)) for inv in chunk for c in _COLUMNS]
                with self._tx(single=True) as db:
                    rows = db.execute(
                        f"INSERT OR IGNORE INTO invocations ({_SELECT})"
                        f" VALUES {', '.join([marks] * len(chunk))} RETURNING id",
                        values,
                    ).fetchall()
                new.update(r[0] for r in rows)
            # (the records that stood in the way, read in the same transaction)
            held = {r.id: r for r in self.get_many([i.id for i in invs if i.id not in new])}
        if len(new) + len(held) < len(invs):
            raise _not_inserted(next(i.id for i in invs if i.id not in new and i.id not in held))
        return [None if inv.id in new else held[inv.id] for inv in invs]

    def update_many_if(
        self,
        updates: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
        *,
        running_below: int | None = None,
        deadline_after: float | None = None,
    ) -> list[Invocation | None]:
        if len(updates) == 1:  # (one statement: no transaction around it)
            inv_id, expect, changes = updates[0]
            one = self.update_if(
                inv_id, expect, changes, running_below=running_below, deadline_after=deadline_after
            )
            return [one]
        if running_below is None and len({inv_id for inv_id, _, _ in updates}) == len(updates):
            # (a running cap is checked record by record, as each lease counts against it;
            # an id twice must see its first update: both go one statement at a time)
            return self._update_batched(updates, deadline_after)
        with self.transaction():
            return [
                self.update_if(
                    inv_id,
                    expect,
                    changes,
                    running_below=running_below,
                    deadline_after=deadline_after,
                )
                for inv_id, expect, changes in updates
            ]

    def _update_batched(
        self,
        updates: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
        deadline_after: float | None,
    ) -> list[Invocation | None]:
        """:meth:`update_many_if` of distinct ids without a running cap: the updates of
        each shape in one statement (per :data:`_BATCH_ROWS`), all in one transaction;
        each record is still decided on its own condition."""
        shapes: dict[_Shape, list[int]] = {}
        for k, (_, expect, changes) in enumerate(updates):
            shapes.setdefault(_shape(expect, changes), []).append(k)
        done: dict[str, Invocation] = {}
        with self.transaction():
            for shape, members in shapes.items():
                for start in range(0, len(members), _BATCH_ROWS):
                    chunk = members[start : start + _BATCH_ROWS]
                    sql = _batch_update_sql(*shape, deadline_after is not None, len(chunk))
                    params: list[Any] = []
                    for n, k in enumerate(chunk, 1):
                        inv_id, expect, changes = updates[k]
                        values, expected_values = _bound(expect, changes)
                        params += [n, inv_id, *values, *expected_values]
                    if deadline_after is not None:
                        params.append(deadline_after)
                    with self._tx(single=True) as db:
                        rows = db.execute(sql, params).fetchall()
                    for row in rows:
                        rec = _from_row(row)
                        done[rec.id] = rec
        return [done.get(inv_id) for inv_id, _, _ in updates]

    def pending(self, queue: str, now: float, limit: int) -> list[Invocation]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_SELECT} FROM invocations INDEXED BY inv_pending"
                " WHERE queue = ? AND state = 'pending' AND available_at <= ?"
                " ORDER BY order_key LIMIT ?",
                (queue, now, limit),
            ).fetchall()
        return [_from_row(r) for r in rows]

    def next_available_at(self, queue: str) -> float | None:
        with self._lock:
            row = self._db.execute(
                "SELECT min(available_at) FROM invocations WHERE queue = ? AND state = 'pending'",
                (queue,),
            ).fetchone()
        return None if row is None else row[0]

    def expired_leases(self, now: float, limit: int) -> list[Invocation]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_SELECT} FROM invocations INDEXED BY inv_leases"
                " WHERE state = 'running' AND lease_expires_at < ?"
                " ORDER BY lease_expires_at LIMIT ?",
                (now, limit),
            ).fetchall()
        return [_from_row(r) for r in rows]

    def counts(self, queue: str, now: float) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute(
                "SELECT CASE WHEN state = 'pending' AND available_at > ? THEN 'scheduled'"
                " ELSE state END AS s, count(*) FROM invocations WHERE queue = ? GROUP BY s",
                (now, queue),
            ).fetchall()
        return {s: n for s, n in rows}

    def running(self, queue: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT count(*) FROM invocations WHERE queue = ? AND state = 'running'",
                (queue,),
            ).fetchone()
        return int(row[0])

    def purge(self, now: float, tombstone_until: float) -> int:
        with self._tx() as db:
            db.execute(
                "DELETE FROM logs WHERE invocation IN"
                " (SELECT id FROM invocations WHERE expires_at <= ?)",
                (now,),
            )
            gone = db.execute(
                "DELETE FROM invocations WHERE expires_at < ?", (tombstone_until,)
            ).rowcount
            stripped = db.execute(
                "UPDATE invocations SET payload = NULL, result = NULL"
                " WHERE expires_at <= ? AND (payload IS NOT NULL OR result IS NOT NULL)",
                (now,),
            ).rowcount
        if self._blob_dir is not None and now >= self._parts_due:
            # (a listing of every blob file: once an hour, not at each minute's purge)
            self._parts_due = now + _PART_SWEEP
            drop_stale_parts(self._blob_dir)
        return gone + stripped

    def list_invocations(
        self, queue: str, state: str | None, now: float, after: str | None, limit: int
    ) -> list[Invocation]:
        where: list[str] = ["queue = ?"]
        params: list[Any] = [queue]
        if state == "scheduled":
            where.append("state = 'pending' AND available_at > ?")
            params.append(now)
        elif state == "pending":
            where.append("state = 'pending' AND available_at <= ?")
            params.append(now)
        elif state is not None:
            where.append("state = ?")
            params.append(state)
        if after is not None:
            where.append("id > ?")
            params.append(after)
        sql = f"SELECT {_SELECT} FROM invocations WHERE {' AND '.join(where)} ORDER BY id LIMIT ?"
        with self._lock:
            rows = self._db.execute(sql, [*params, limit]).fetchall()
        return [_from_row(r) for r in rows]

    # --- job output ---------------------------------------------------------------------
    def append_logs(self, inv_id: str, entries: Sequence[LogEntry]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT OR IGNORE INTO logs (invocation, seq, stream, text, at, attempt)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(inv_id, e.seq, e.stream, e.text, e.at, e.attempt) for e in entries],
            )

    def read_logs(self, inv_id: str, after: int, limit: int) -> list[LogEntry]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, stream, text, at, attempt FROM logs"
                " WHERE invocation = ? AND seq > ? ORDER BY seq LIMIT ?",
                (inv_id, after, limit),
            ).fetchall()
        return [LogEntry(*r) for r in rows]

    # --- tokens and daemons ----------------------------------------------------------
    def _put_doc(self, table: str, key: str, doc: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute(f"INSERT OR REPLACE INTO {table} (id, doc) VALUES (?, ?)", (key, _pack(doc)))

    def _get_doc(self, table: str, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(f"SELECT doc FROM {table} WHERE id = ?", (key,)).fetchone()
        return None if row is None else dict(_unpack(row[0]))

    def _all_docs(self, table: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(f"SELECT doc FROM {table} ORDER BY id").fetchall()
        return [dict(_unpack(r[0])) for r in rows]

    def put_token(self, token: TokenRecord) -> None:
        self._put_doc("tokens", token.id, asdict(token))

    def get_token(self, token_id: str) -> TokenRecord | None:
        doc = self._get_doc("tokens", token_id)
        return None if doc is None else TokenRecord(**doc)

    def list_tokens(self) -> list[TokenRecord]:
        return [TokenRecord(**d) for d in self._all_docs("tokens")]

    def get_daemon(self, daemon_id: str) -> DaemonRecord | None:
        doc = self._get_doc("daemons", daemon_id)
        return None if doc is None else DaemonRecord.from_doc(doc)

    def change_daemon(
        self, daemon_id: str, change: Callable[[DaemonRecord | None], DaemonRecord | None]
    ) -> DaemonRecord | None:
        with self._tx() as db:  # (the write lock from the read on: nobody writes between)
            row = db.execute("SELECT doc FROM daemons WHERE id = ?", (daemon_id,)).fetchone()
            rec = change(None if row is None else DaemonRecord.from_doc(_unpack(row[0])))
            if rec is not None:
                db.execute(
                    "INSERT OR REPLACE INTO daemons (id, doc) VALUES (?, ?)",
                    (daemon_id, _pack(rec.doc())),
                )
        return rec

    def list_daemons(self) -> list[DaemonRecord]:
        return [DaemonRecord.from_doc(d) for d in self._all_docs("daemons")]

    def delete_daemon(self, daemon_id: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM daemons WHERE id = ?", (daemon_id,)).rowcount == 1

    # --- data keys ------------------------------------------------------------------------
    def put_data_key(self, key: str, digest: str, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO data_keys (key, digest, updated_at) VALUES (?, ?, ?)",
                (key, digest, now),
            )

    def get_data_keys(self, keys: Sequence[str]) -> dict[str, str]:
        rows = self._select_in("SELECT key, digest FROM data_keys WHERE key IN ({})", keys)
        return {k: d for k, d in rows}

    # --- blobs ----------------------------------------------------------------
    # A plane file keeps its blobs as files beside it (``<plane>.blobs/<digest>``): a
    # blob of megabytes in the database would be written twice (WAL, then the checkpoint,
    # which stalls every other write behind it). A ":memory:" plane keeps them in its
    # table, as do plane files written before (read from there when no file has them).
    def _blob_path(self, digest: str) -> Path | None:
        if self._blob_dir is None or not is_digest(digest):
            return None
        return self._blob_dir / digest

    def blob_home(self) -> tuple[str, str] | None:
        """The blob directory (made if missing) and the id in its ``.id`` file (made by
        the first process to ask; see :class:`~dreamlake.lakeshore.plane.store.BlobHome`).
        None for ``":memory:"``, and where the directory cannot be so marked."""
        if self._blob_dir is None:
            return None
        if self._home is None:
            try:
                home = self._blob_dir.resolve()
                home.mkdir(exist_ok=True)
                self._home = (str(home), _directory_id(home))
            except OSError:
                return None  # (clients then read every blob over HTTP)
        return self._home

    def put_blob(self, digest: str, data: bytes, now: float) -> None:
        path = self._blob_path(digest)
        if path is None:
            with self._tx() as db:
                db.execute(
                    "INSERT OR IGNORE INTO blobs (digest, data, created_at) VALUES (?, ?, ?)",
                    (digest, data, now),
                )
            return
        if path.exists():
            return
        writer = BlobFile(path, sync=self._full)
        try:
            writer.write(data)
        except BaseException:
            writer.abort()  # a failed write leaves nothing behind
            raise
        writer.commit()

    def blob_writer(self, digest: str) -> BlobFile | None:
        """A writer of the blob's file, for a blob that arrives in pieces; None for a
        ``":memory:"`` plane (its blobs live in its table)."""
        path = self._blob_path(digest)
        return None if path is None else BlobFile(path, sync=self._full)

    def get_blob(self, digest: str) -> bytes | None:
        path = self._blob_path(digest)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                return path.read_bytes()
        with self._lock:
            row = self._db.execute("SELECT data FROM blobs WHERE digest = ?", (digest,)).fetchone()
        return None if row is None else bytes(row[0])

    def has_blobs(self, digests: Iterable[str]) -> set[str]:
        wanted = set(digests)
        found = {d for d in wanted if (p := self._blob_path(d)) is not None and p.exists()}
        rest = wanted - found
        if rest:
            found |= {
                r[0] for r in self._select_in("SELECT digest FROM blobs WHERE digest IN ({})", rest)
            }
        return found

    # --- change detection ---------------------------------------------------------
    def change_marker(self) -> int:
        with self._lock:
            row = self._db.execute("PRAGMA data_version").fetchone()
        return int(row[0])

    def write_watch(self) -> FileWatch | None:
        """A watch of writes to the file's write-ahead log (every commit by any process
        appends to it; a checkpoint writes only the file), for the poller to sleep on;
        None where there is none (a ``:memory:`` store, a file not in WAL mode, no
        inotify)."""
        if not self.shared:
            return None
        log = self.path + "-wal"
        if not os.path.exists(log):
            self.change_marker()  # (a read opens it, in WAL mode)
        # A commit shows once its last write to the log is done and the log's index
        # updated; a durability="full" commit syncs the log before that.
        return watch_file(log, settle=_SETTLE_FULL if self._full else 0.0)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
        with self._lock:
            self._db.close()


#: seconds a commit with durability="full" may take to show after its first write to
#: the log (its sync on a slow disk): the poller keeps looking that long after a write
_SETTLE_FULL = 1.0


def _directory_id(home: Path) -> str:
    """The id in ``home/.id``, written first by whichever process gets there first."""
    mark = home / ".id"
    with contextlib.suppress(FileNotFoundError):
        return mark.read_text().strip()
    mine = home / f".id.{os.getpid()}.{threading.get_ident()}"
    mine.write_text(secrets.token_hex(16))
    try:
        os.link(mine, mark)  # fails if another process linked its own first
    except FileExistsError:
        pass
    finally:
        mine.unlink(missing_ok=True)
    return mark.read_text().strip()
