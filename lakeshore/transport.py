"""The seam between the SDK and a plane.

:class:`Transport` is the small interface both implementations share: the embedded
plane (:class:`~dreamlake.lakeshore.plane.Plane` itself, in this process) and the HTTP
client of a remote plane. The SDK (queues, ``udf``, ``run_worker``) talks only to it,
so everything above this line is tested end to end without a network.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .plane.model import (
    Claim,
    DaemonRecord,
    HeartbeatAnswer,
    Invocation,
    LogEntry,
    QueueSpec,
    State,
    Submission,
)

__all__ = ["AsyncResults", "Transport", "Unwatch", "put_missing"]


def put_missing(transport: Transport, blobs: Mapping[str, bytes]) -> None:
    """Upload those of ``blobs`` the plane does not hold yet (one question, then a put
    each): content-addressed, so a blob already there is never sent again."""
    if blobs:
        for digest in transport.missing_blobs(blobs):
            transport.put_blob(digest, blobs[digest])


class Unwatch(Protocol):
    """What ``Transport.watch`` returns: called bare it removes the whole watch; with
    ``ids``, only those ids of it (a wait on one id of many that gave up)."""

    def __call__(self, ids: Iterable[str] | None = None, /) -> None: ...


class Transport(Protocol):
    def now(self) -> float:
        """The plane's clock (expiry is judged by it, not by the caller's)."""
        ...

    def inline_limit(self) -> int:
        """Bytes of arguments or result kept inline; larger ones travel as blobs."""
        ...

    def ensure_queue(
        self, spec: QueueSpec, *, create: bool = True, check: Iterable[str] = ()
    ) -> QueueSpec: ...

    def update_queue(self, name: str, **settings: Any) -> QueueSpec: ...

    def delete_queue(self, name: str, *, force: bool = False) -> int: ...

    def list_queues(self) -> list[dict[str, Any]]: ...

    def prune_queues(self, older_than: float) -> list[str]: ...

    def counts(self, name: str) -> dict[str, int]: ...

    def submit(self, subs: Sequence[Submission]) -> list[str]: ...

    def get(self, inv_id: str) -> Invocation: ...

    def get_many(self, ids: Sequence[str]) -> list[Invocation]: ...

    def watch(self, ids: Sequence[str], callback: Callable[[Invocation], None]) -> Unwatch: ...

    def cancel(self, inv_id: str) -> State: ...

    def set_priority(self, inv_id: str, priority: float) -> Invocation: ...

    def list_invocations(
        self, queue: str, state: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[Invocation]: ...

    def retry(self, inv_id: str) -> Invocation: ...

    def claim(
        self,
        queues: Sequence[str],
        worker: str,
        *,
        limit: int = 1,
        wait: float = 0.0,
        lease_seconds: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Claim]: ...

    def heartbeat(
        self, inv_id: str, lease_token: str, *, lease_seconds: float | None = None
    ) -> HeartbeatAnswer: ...

    def complete(self, inv_id: str, lease_token: str, result: bytes) -> None: ...

    def complete_many(self, items: Sequence[tuple[str, str, bytes]]) -> list[Exception | None]:
        """Record several results ``(id, lease_token, result)`` in one go; each item's
        refusal (or None) in order."""
        ...

    def fail_many(
        self, items: Sequence[tuple[str, str, dict[str, Any], bool]]
    ) -> list[Exception | None]:
        """Record several failures ``(id, lease_token, error, retryable)`` in one go."""
        ...

    def release(self, inv_id: str, lease_token: str) -> None: ...

    def report_progress(
        self, inv_id: str, lease_token: str, fraction: float, message: str | None = None
    ) -> None: ...

    def append_logs(
        self, inv_id: str, lease_token: str, chunks: Sequence[tuple[int, str, str]]
    ) -> None: ...

    def read_logs(self, inv_id: str, after: int = 0, limit: int = 1000) -> list[LogEntry]: ...

    def fail(
        self, inv_id: str, lease_token: str, error: dict[str, Any], *, retryable: bool = True
    ) -> State: ...

    def register_daemon(
        self,
        name: str,
        *,
        daemon_id: str | None = None,
        queues: Sequence[str] = (),
        concurrency: int = 1,
        python: str = "",
        pickle_protocols: Sequence[int] = (),
        host: str = "",
    ) -> DaemonRecord: ...

    def daemon_heartbeat(
        self, daemon_id: str, running: int | None = None, *, stopped: bool = False
    ) -> DaemonRecord: ...

    def list_daemons(self) -> list[DaemonRecord]: ...

    def update_daemon(
        self,
        daemon_id: str,
        *,
        add_queues: Sequence[str] = (),
        remove_queues: Sequence[str] = (),
        concurrency: int | None = None,
    ) -> DaemonRecord: ...

    def drain_daemon(self, daemon_id: str) -> DaemonRecord: ...

    def remove_daemon(self, daemon_id: str) -> bool: ...

    def put_data(self, key: str, digest: str) -> None: ...

    def data_digests(self, keys: Sequence[str]) -> dict[str, str]: ...

    def blob_url(self, digest: str) -> str:
        """A URL that serves the blob to anyone holding it, for a while."""
        ...

    def put_blob(self, digest: str, data: bytes) -> None: ...

    def get_blob(self, digest: str) -> bytes: ...

    def missing_blobs(self, digests: Iterable[str]) -> set[str]: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncResults(Protocol):
    """A transport that awaits results without blocking the event loop (the aws://
    transport, on aioboto3). ``Queue.result`` uses it when the transport offers it."""

    async def aresult(self, inv_id: str, timeout: float | None = None) -> Any: ...
