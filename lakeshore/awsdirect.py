"""``Dispatch("aws://<stack>")``: producers and workers inside AWS reach the stack's
DynamoDB tables and S3 bucket directly, with their own IAM credentials — no API Gateway
hop, no Lambda, no bearer token.

::

    aws://my-stack                  table and bucket names from the stack's Outputs
                                    (CloudFormation DescribeStacks)
    aws://env                       names from LAKESHORE_QUEUES_TABLE, ..., LAKESHORE_BLOB_BUCKET
                                    (keys.ENV_VARS, as the stack's functions get them)
    ...?region=eu-west-1            the region (else the SDK's: AWS_REGION, the profile)
    ...?profile=ops                 a named profile of the shared AWS config
    ...?endpoint=http://127.0.0.1:5000   another endpoint for every service: a moto server,
                                    ``lakeshore dev``; on loopback, without credentials in the
                                    environment or a profile, dummy credentials are used

The transport is :class:`AwsPlane`: the embedded plane core over
:class:`~dreamlake.lakeshore.stores.dynamo.DynamoStore`, exactly what the stack's
Lambda functions run, so every lifecycle rule holds unchanged; concurrency is
DynamoDB's conditional writes. The caller needs the data-plane permissions the
functions have (DynamoDB item, query and batch calls on the four tables and their
indexes; S3 get/put/head/delete on the bucket), and ``cloudformation:DescribeStacks``
for the stack form. Plane settings (``lease_seconds``, ``max_attempts``, ``retention``,
...) are this process's: keep them equal to the stack's.

Async, precisely. The SDK's async :class:`~dreamlake.lakeshore.Queue` calls the
transport synchronously, as on every transport: ``submit``, ``status``, ``cancel`` and
``set_priority`` block the event loop for their boto3 calls; ``result`` blocks it for
the watch's first read (one ``BatchGetItem``) and for reading an offloaded result or a
result blob from S3, and otherwise waits on a plane thread that polls DynamoDB every
0.5 s, so the loop runs meanwhile. :attr:`AwsPlane.probe` (:class:`AsyncDynamoProbe`) is
the aioboto3 path, which never blocks the loop: ``await plane.aresult(id)`` (=
``probe.result``), ``probe.wait(ids)``, ``probe.get(id)`` and ``probe.get_blob(digest)``
— one coalesced ``BatchGetItem`` poll per event loop for every awaited id, offloaded
results and errors and result blobs read from S3 on aioboto3.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from .clock import Clock
from .errors import NotFound, UnknownInvocation
from .plane import FINISHED, Invocation, Plane, State
from .plane.ids import group_of
from .stores import keys as K
from .stores.dynamo_groups import (
    Group,
    group_key,
    is_part,
    parse_group,
    record,
    unpack_parts,
)

if TYPE_CHECKING:
    from .stores.dynamo import DynamoStore

__all__ = [
    "LOCAL_CREDENTIALS",
    "STACK_OUTPUTS",
    "AsyncDynamoProbe",
    "AwsPlane",
    "AwsTarget",
    "open_aws",
    "stack_resources",
]

#: stack output → Resources field: each resource's logical id + "Name" (template.yaml's
#: Outputs; tests/test_awsdirect.py checks the template has every one)
STACK_OUTPUTS = {
    **{f"{logical}Name": field for logical, field in K.TABLE_RESOURCES.items()},
    f"{K.BUCKET_RESOURCE}Name": "bucket",
}
#: credentials for a loopback endpoint (moto wants some; they never leave the machine)
LOCAL_CREDENTIALS = {
    "aws_access_key_id": "lakeshore-dev",
    "aws_secret_access_key": "lakeshore-dev",
}
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_QUERY = frozenset({"region", "endpoint", "profile"})
#: a finished invocation's group and its id
_Found = tuple[Group, str]
#: BatchGetItem takes at most this many keys
_BATCH_GET = 100


@dataclass(frozen=True)
class AwsTarget:
    """A parsed ``aws://`` target."""

    #: a CloudFormation stack name, or "env" for the environment's names
    stack: str
    region: str | None = None
    endpoint: str | None = None
    profile: str | None = None

    @classmethod
    def parse(cls, target: str) -> AwsTarget:
        """Raises ValueError for anything but ``aws://<stack>[?region=&endpoint=&profile=]``."""
        parts = urlsplit(target)
        if parts.scheme != "aws" or not parts.netloc or parts.path not in ("", "/"):
            raise ValueError(f"an aws:// target is aws://<stack or env>[?options], not {target!r}")
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        unknown = set(query) - _QUERY
        if unknown:
            raise ValueError(
                f"unknown aws:// option(s) {', '.join(sorted(unknown))}: "
                f"use {', '.join(sorted(_QUERY))}"
            )
        one: dict[str, str | None] = {}
        for name in _QUERY:
            values = query.get(name, [])
            if len(values) > 1 or values == [""]:
                raise ValueError(f"aws:// option {name} needs one value")
            one[name] = values[0] if values else None
        endpoint = one["endpoint"]
        if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
            raise ValueError(f"aws:// endpoint must be an http(s) URL, not {endpoint!r}")
        return cls(parts.netloc, one["region"], endpoint, one["profile"])

    @property
    def local(self) -> bool:
        """The endpoint is on this machine (a moto server, ``lakeshore dev``)."""
        return self.endpoint is not None and urlsplit(self.endpoint).hostname in _LOOPBACK


def _session(target: AwsTarget) -> tuple[Any, bool]:
    """The boto3 session the target names (its profile and region), and whether it uses
    :data:`LOCAL_CREDENTIALS`: a loopback endpoint, no credentials in the environment
    and no profile named."""
    import boto3  # type: ignore[import-untyped]

    session = boto3.Session(profile_name=target.profile, region_name=target.region)
    if session.region_name is None:
        raise ValueError(f"aws://{target.stack} needs a region: add ?region=... or set AWS_REGION")
    if target.local and target.profile is None and "AWS_ACCESS_KEY_ID" not in os.environ:
        return boto3.Session(region_name=session.region_name, **LOCAL_CREDENTIALS), True
    return session, False


def stack_resources(stack: str, session: Any, endpoint: str | None = None) -> K.Resources:
    """The table and bucket names of a deployed stack, from its Outputs; ``"env"`` reads
    them from the environment instead (:meth:`keys.Resources.from_env`).

    Raises ValueError when the stack does not exist or lacks one of
    :data:`STACK_OUTPUTS`.
    """
    if stack == "env":
        return K.Resources.from_env()
    cfn = session.client("cloudformation", endpoint_url=endpoint)
    try:
        (described,) = cfn.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        message = exc.response.get("Error", {}).get("Message", str(exc))
        raise ValueError(f"aws://{stack}: {message}") from None
    finally:
        cfn.close()
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    missing = sorted(set(STACK_OUTPUTS) - set(outputs))
    if missing:
        raise ValueError(
            f"stack {stack!r} has no output {', '.join(missing)}: is it a Lakeshore stack "
            "(deployed from this version's template.yaml)?"
        )
    return K.Resources(**{field: outputs[key] for key, field in STACK_OUTPUTS.items()})


def open_aws(target: str, *, clock: Clock | None, options: Mapping[str, Any]) -> AwsPlane:
    """The aws:// transport: an :class:`AwsPlane` on the tables ``target`` names.

    ``options`` are the embedded plane's (``lease_seconds``, ``max_attempts``,
    ``retention``, ...).
    """
    from .handlers.aws import map_errors
    from .stores.dynamo import DynamoStore, make_clients

    parsed = AwsTarget.parse(target)
    session, local = _session(parsed)
    resources = stack_resources(parsed.stack, session, parsed.endpoint)
    ddb, s3 = make_clients(session.region_name, parsed.endpoint, session=session)
    try:
        # as in the stack's functions: throttled, failing or unreachable storage (after
        # botocore's retries) is Unavailable, which workers ride out with backoff
        store = DynamoStore(resources, dynamodb=map_errors(ddb), s3=map_errors(s3))
        probe = AsyncDynamoProbe(
            resources,
            region=session.region_name,
            endpoint=parsed.endpoint,
            profile=parsed.profile,
            credentials=LOCAL_CREDENTIALS if local else None,
        )
        return AwsPlane(store, parsed, probe, (ddb, s3), clock=clock, **options)
    except BaseException:
        ddb.close()
        s3.close()
        raise


class AwsPlane(Plane):
    """The plane core over a stack's tables, in this process: the aws:// transport.

    It closes the boto3 clients it is given. :attr:`probe` is its aioboto3 read path.
    """

    def __init__(
        self,
        store: DynamoStore,
        target: AwsTarget,
        probe: AsyncDynamoProbe,
        clients: tuple[Any, Any],
        **plane_options: Any,
    ) -> None:
        super().__init__(store, **plane_options)
        self.target = target
        #: awaitable reads on aioboto3 (never blocking the event loop)
        self.probe = probe
        probe.plane = self
        self._clients = clients

    @property
    def resources(self) -> K.Resources:
        return self.probe.resources

    async def aresult(self, inv_id: str, timeout: float | None = None) -> Any:
        """``Queue.result`` on aioboto3: see :meth:`AsyncDynamoProbe.result`."""
        return await self.probe.result(inv_id, timeout)

    def close(self) -> None:
        try:
            super().close()
        finally:
            for client in self._clients:
                client.close()


# --- the aioboto3 path ---------------------------------------------------------------------


class _Watch:
    """The ids one event loop awaits, and the task polling them."""

    def __init__(self) -> None:
        self.waiters: dict[str, list[asyncio.Future[_Found]]] = {}
        self.task: asyncio.Task[None] | None = None

    def add(self, inv_id: str) -> asyncio.Future[_Found]:
        fut: asyncio.Future[_Found] = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(inv_id, []).append(fut)
        return fut

    def remove(self, inv_id: str, fut: asyncio.Future[_Found]) -> None:
        futs = self.waiters.get(inv_id, [])
        if fut in futs:
            futs.remove(fut)
        if not futs:
            self.waiters.pop(inv_id, None)

    def settle(
        self, inv_id: str, found: _Found | None = None, exc: Exception | None = None
    ) -> None:
        for fut in self.waiters.pop(inv_id, []):
            if fut.done():
                continue
            if exc is not None:
                fut.set_exception(exc)
            elif found is not None:
                fut.set_result(found)


class AsyncDynamoProbe:
    """Awaitable reads of a stack's invocations on aioboto3.

    Every id awaited on one event loop joins one poll: a task that reads all of them
    with ``BatchGetItem`` (strongly consistent) every ``poll_interval`` seconds while
    anybody waits, and settles each as it finishes. The task owns one aioboto3 DynamoDB
    client for its life; S3 clients are opened only to read offloaded results and
    errors. Records come back without their payload (a result wait never needs it).

    The rules stay the plane's: unknown is :class:`UnknownInvocation`, expired and
    failed outcomes are judged by :func:`~dreamlake.lakeshore.submit.outcome`.
    """

    def __init__(
        self,
        resources: K.Resources,
        *,
        region: str,
        endpoint: str | None = None,
        profile: str | None = None,
        credentials: Mapping[str, str] | None = None,
        poll_interval: float = 0.5,
    ) -> None:
        self.resources = resources
        self.region = region
        self.endpoint = endpoint
        self.profile = profile
        #: fixed credentials (the loopback dummies); None: aioboto3 resolves its own
        #: chain, so credentials that expire are refreshed as in boto3
        self.credentials = dict(credentials) if credentials is not None else None
        self.poll_interval = poll_interval
        #: the plane whose clock and rules judge outcomes (set by AwsPlane)
        self.plane: Plane | None = None
        self._session: Any = None
        self._watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watch] = (
            weakref.WeakKeyDictionary()
        )

    # --- public --------------------------------------------------------------------------
    async def result(self, inv_id: str, timeout: float | None = None) -> Any:
        """The invocation's return value, or what it raised (as ``Queue.result``)."""
        from .submit import outcome
        from .wire import result_blob

        plane = self._plane()
        (rec,) = await self.wait([inv_id], timeout)
        if rec.state is State.SUCCEEDED and rec.result is not None:
            ref = None if rec.is_expired(plane.now()) else result_blob(rec.result)
            if ref is not None:
                # The blob holds the inner result envelope: with it in place of the
                # reference, outcome() decodes it without a (blocking) blob read.
                rec = replace(rec, result=await self.get_blob(ref))
        return outcome(rec, plane)

    async def wait(self, ids: Sequence[str], timeout: float | None = None) -> list[Invocation]:
        """The records of ``ids`` once every one is finished (in the order of ``ids``).

        Raises :class:`UnknownInvocation` for an id the tables do not have, and
        ``TimeoutError`` after ``timeout`` seconds (the invocations keep going).
        """
        ids = list(dict.fromkeys(ids))
        loop = asyncio.get_running_loop()
        watch = self._watches.get(loop)
        if watch is None:
            watch = self._watches[loop] = _Watch()
        futs = [watch.add(inv_id) for inv_id in ids]
        if watch.task is None or watch.task.done():
            watch.task = loop.create_task(self._poll(watch))
        try:
            items = await asyncio.wait_for(asyncio.gather(*futs), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"invocation(s) {', '.join(ids)} did not finish within {timeout}s (they keep going)"
            ) from None
        finally:
            for inv_id, fut in zip(ids, futs, strict=True):
                watch.remove(inv_id, fut)
                if fut.done() and not fut.cancelled():
                    fut.exception()  # retrieved: gather raised only the first
        return await self._shown(items)

    async def get(self, inv_id: str) -> Invocation:
        """The record now (any state, without its payload)."""
        async with self._client("dynamodb") as ddb:
            out = await ddb.get_item(
                TableName=self.resources.invocations,
                Key={"id": {"S": group_key(inv_id)}},
                ConsistentRead=True,
            )
        g = parse_group(out["Item"]) if "Item" in out else None
        if g is None or inv_id not in g.slots:
            raise UnknownInvocation(f"no invocation {inv_id!r} on this plane")
        return (await self._shown([(g, inv_id)]))[0]

    async def _shown(self, found: Sequence[_Found]) -> list[Invocation]:
        """The records as the plane shows them: past its tombstone one is unknown (the
        table's TTL may not have deleted it yet), past expiry without its result. Each
        result item (or S3 object) is read once for all the records it holds."""
        parts: dict[str, Any] = {}
        for g, sid in found:
            slot = g.slots[sid]
            for key in (slot.result_at, slot.error_at):
                if key is not None and key not in parts:
                    parts[key] = await self._read_key(key)

        def fetch(key: str, sid: str) -> bytes | None:
            got = parts.get(key)  # a result item's parts, an object's bytes, or None
            return got.get(sid) if isinstance(got, dict) else got

        shown = []
        for g, sid in found:
            rec = self._plane().visible(record(g, sid, fetch))
            if rec is None:
                raise UnknownInvocation(f"no invocation {sid!r} on this plane")
            shown.append(rec)
        return shown

    async def get_blob(self, digest: str) -> bytes:
        """A content-addressed blob's bytes (:class:`NotFound` when absent)."""
        data = await self._get_object(K.blob_key(digest))
        if data is None:
            raise NotFound(f"no blob {digest!r} on this plane")
        return data

    # --- internals -------------------------------------------------------------------------
    def _plane(self) -> Plane:
        if self.plane is None:
            raise RuntimeError("this probe serves no plane (AwsPlane sets it)")
        return self.plane

    def _client(self, service: str) -> Any:
        """An aioboto3 client (an async context manager; bound to the running loop)."""
        import aioboto3  # type: ignore[import-untyped]
        from aiobotocore.config import AioConfig  # type: ignore[import-untyped]

        if self._session is None:
            fixed = self.credentials or {}
            profile = None if fixed else self.profile
            self._session = aioboto3.Session(region_name=self.region, profile_name=profile, **fixed)
        config = AioConfig(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5)
        if service == "s3":
            style = "path" if self.endpoint else "virtual"
            config = config.merge(
                AioConfig(signature_version="s3v4", s3={"addressing_style": style})
            )
        return self._session.client(service, endpoint_url=self.endpoint, config=config)

    async def _poll(self, watch: _Watch) -> None:
        """Read every awaited id's group, settle the finished and the unknown, sleep,
        repeat."""
        table = self.resources.invocations
        try:
            async with self._client("dynamodb") as ddb:
                while watch.waiters:
                    ids = list(watch.waiters)
                    names = list(dict.fromkeys(group_of(i) for i in ids))
                    groups: dict[str, Group] = {}
                    for start in range(0, len(names), _BATCH_GET):
                        keys = [group_key(n) for n in names[start : start + _BATCH_GET]]
                        found = await _batch_get(ddb, table, keys)
                        groups.update((g.name, g) for g in map(parse_group, found.values()))
                    for inv_id in ids:
                        g = groups.get(group_of(inv_id))
                        if g is None or inv_id not in g.slots:
                            watch.settle(
                                inv_id,
                                exc=UnknownInvocation(f"no invocation {inv_id!r} on this plane"),
                            )
                        elif g.slots[inv_id].state in FINISHED:
                            watch.settle(inv_id, (g, inv_id))
                    if watch.waiters:
                        await asyncio.sleep(self.poll_interval)
        except Exception as exc:  # a failed read fails every wait it serves
            for inv_id in list(watch.waiters):
                watch.settle(inv_id, exc=exc)

    async def _read_key(self, key: str) -> dict[str, bytes] | bytes | None:
        """A result item's parts (by id), or an S3 object's bytes."""
        if not is_part(key):
            return await self._get_object(key)
        async with self._client("dynamodb") as ddb:
            out = await ddb.get_item(
                TableName=self.resources.invocations, Key={"id": {"S": key}}, ConsistentRead=True
            )
        return unpack_parts(out["Item"]) if "Item" in out else None

    async def _get_object(self, key: str) -> bytes | None:
        async with self._client("s3") as s3:
            try:
                out = await s3.get_object(Bucket=self.resources.bucket, Key=key)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise
            async with out["Body"] as body:
                data: bytes = await body.read()
        return data


async def _batch_get(ddb: Any, table: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Items by id (ids absent from the table are absent here); retries unprocessed keys."""
    found: dict[str, dict[str, Any]] = {}
    request: dict[str, Any] = {
        table: {"Keys": [{"id": {"S": i}} for i in ids], "ConsistentRead": True}
    }
    delay = 0.01
    while request:
        out = await ddb.batch_get_item(RequestItems=request)
        for item in out.get("Responses", {}).get(table, []):
            found[item["id"]["S"]] = item
        request = out.get("UnprocessedKeys") or {}
        if request:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
    return found
