"""The DynamoDB store's parts outside the invocation lifecycle, and its plumbing.

Blobs and offloaded fields in S3, job output (the logs table), tokens, daemons and data
keys (the records table), and the paging and batching every part uses.
:class:`~.dynamo.DynamoStore` inherits all of it.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from ..errors import Unavailable
from ..plane.model import DaemonRecord, LogEntry, TokenRecord
from . import keys as K
from .dynamo_items import Item, num, pack, unpack

__all__ = ["DynamoExtras", "backoff", "error_code"]

#: how long a presigned URL may live with SigV4
_MAX_URL_TTL = 7 * 86400
#: concurrent requests for one batch of independent writes or reads
_FAN_OUT = 16
#: rounds of a batch request whose items the service keeps leaving unprocessed
#: (throttling) before the store gives up (Unavailable): a few seconds at most
_UNPROCESSED_ROUNDS = 12
#: reads and conditional writes of a record changed in place, while others keep writing
#: it between the two, before the store gives up (Unavailable)
_CHANGE_TRIES = 8


def error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def backoff(attempt: int) -> None:
    time.sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))


def _next_round(attempt: int) -> int:
    """Back off before another round of a batch's unprocessed items; give up after
    ``_UNPROCESSED_ROUNDS`` (the caller's retry, or the API's 503, takes over)."""
    if attempt + 1 >= _UNPROCESSED_ROUNDS:
        raise Unavailable("DynamoDB keeps leaving a batch unprocessed (throttled); try again")
    backoff(attempt)
    return attempt + 1


class DynamoExtras:
    _ddb: Any
    _s3: Any
    _bucket: str
    _records: str
    _logs: str
    _blob_refresh_after: float | None

    # --- tokens, daemons and data keys (records table) ---------------------------------
    def _put_record(self, kind: str, rec_id: str, doc: dict[str, Any]) -> None:
        self._ddb.put_item(
            TableName=self._records,
            Item={K.REC_KIND: {"S": kind}, K.REC_ID: {"S": rec_id}, K.REC_DOC: {"B": pack(doc)}},
        )

    def _get_record(
        self, kind: str, rec_id: str, *, consistent: bool = True
    ) -> dict[str, Any] | None:
        out = self._ddb.get_item(
            TableName=self._records,
            Key={K.REC_KIND: {"S": kind}, K.REC_ID: {"S": rec_id}},
            ConsistentRead=consistent,
        )
        return dict(unpack(out["Item"][K.REC_DOC]["B"])) if "Item" in out else None

    def _list_records(self, kind: str) -> list[dict[str, Any]]:
        items = self._pages(
            self._ddb.query,
            TableName=self._records,
            KeyConditionExpression="#k = :k",
            ExpressionAttributeNames={"#k": K.REC_KIND},
            ExpressionAttributeValues={":k": {"S": kind}},
            ConsistentRead=True,
        )
        return [dict(unpack(i[K.REC_DOC]["B"])) for i in items]

    def put_token(self, token: TokenRecord) -> None:
        self._put_record(K.REC_TOKEN, token.id, asdict(token))

    def get_token(self, token_id: str) -> TokenRecord | None:
        """Every API request reads its token: eventually consistently (half a read
        unit), strongly only when that finds nothing, so a new token works at once. A
        revocation takes effect within about a second."""
        doc = self._get_record(K.REC_TOKEN, token_id, consistent=False)
        if doc is None:
            doc = self._get_record(K.REC_TOKEN, token_id)
        return None if doc is None else TokenRecord(**doc)

    def list_tokens(self) -> list[TokenRecord]:
        return [TokenRecord(**d) for d in self._list_records(K.REC_TOKEN)]

    def get_daemon(self, daemon_id: str) -> DaemonRecord | None:
        doc = self._get_record(K.REC_DAEMON, daemon_id)
        return None if doc is None else DaemonRecord.from_doc(doc)

    def change_daemon(
        self, daemon_id: str, change: Callable[[DaemonRecord | None], DaemonRecord | None]
    ) -> DaemonRecord | None:
        key = {K.REC_KIND: {"S": K.REC_DAEMON}, K.REC_ID: {"S": daemon_id}}
        for _ in range(_CHANGE_TRIES):
            out = self._ddb.get_item(TableName=self._records, Key=key, ConsistentRead=True)
            old = out["Item"][K.REC_DOC]["B"] if "Item" in out else None
            rec = change(None if old is None else DaemonRecord.from_doc(unpack(old)))
            if rec is None:
                return None
            # written only over the record as read (or none): another write since, read again
            condition: dict[str, Any] = (
                {
                    "ConditionExpression": "attribute_not_exists(#i)",
                    "ExpressionAttributeNames": {"#i": K.REC_ID},
                }
                if old is None
                else {
                    "ConditionExpression": "#d = :old",
                    "ExpressionAttributeNames": {"#d": K.REC_DOC},
                    "ExpressionAttributeValues": {":old": {"B": old}},
                }
            )
            try:
                self._ddb.put_item(
                    TableName=self._records,
                    Item={**key, K.REC_DOC: {"B": pack(rec.doc())}},
                    **condition,
                )
                return rec
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise
        raise Unavailable(f"daemon {daemon_id!r} kept changing under this write; retry")

    def list_daemons(self) -> list[DaemonRecord]:
        return [DaemonRecord.from_doc(d) for d in self._list_records(K.REC_DAEMON)]

    def delete_daemon(self, daemon_id: str) -> bool:
        out = self._ddb.delete_item(
            TableName=self._records,
            Key={K.REC_KIND: {"S": K.REC_DAEMON}, K.REC_ID: {"S": daemon_id}},
            ReturnValues="ALL_OLD",
        )
        return "Attributes" in out

    def put_data_key(self, key: str, digest: str, now: float) -> None:
        self._ddb.put_item(
            TableName=self._records,
            Item={
                K.REC_KIND: {"S": K.REC_DATA},
                K.REC_ID: {"S": key},
                K.REC_DIGEST: {"S": digest},
                K.REC_UPDATED: num(now),
            },
        )

    def get_data_keys(self, keys: Sequence[str]) -> dict[str, str]:
        wanted = list(dict.fromkeys(keys))
        found: dict[str, str] = {}
        for start in range(0, len(wanted), 100):
            chunk = [
                {K.REC_KIND: {"S": K.REC_DATA}, K.REC_ID: {"S": k}}
                for k in wanted[start : start + 100]
            ]
            for item in self._batch_get(self._records, chunk):
                found[item[K.REC_ID]["S"]] = item[K.REC_DIGEST]["S"]
        return found

    # --- job output (logs table) -------------------------------------------------------
    def append_logs(self, inv_id: str, entries: Sequence[LogEntry]) -> None:
        """One conditional put per entry (concurrently): an existing seq is kept as it
        is, which a batch write (last writer wins) would not do."""
        entries = list({e.seq: e for e in reversed(entries)}.values())  # first of each seq
        if len(entries) <= 1:
            for e in entries:
                self._put_log(inv_id, e)
            return
        with ThreadPoolExecutor(max_workers=min(_FAN_OUT, len(entries))) as pool:
            list(pool.map(lambda e: self._put_log(inv_id, e), entries))

    def _put_log(self, inv_id: str, e: LogEntry) -> None:
        item: Item = {
            K.LOG_INV: {"S": inv_id},
            K.LOG_SEQ: num(int(e.seq)),
            "stream": {"S": e.stream},
            "at": num(float(e.at)),
            "attempt": num(int(e.attempt)),
            K.PURGE_AT: num(int(e.at + K.LOG_TTL)),
        }
        text = e.text.encode()
        key = None
        if len(text) > K.LOG_INLINE_MAX:
            key = K.log_text_key(inv_id, e.seq, hashlib.sha256(text).hexdigest())
            self._upload({key: text})
            item[K.LOG_TEXT_REF] = {"S": key}
        else:
            item["text"] = {"S": e.text}
        try:
            self._ddb.put_item(
                TableName=self._logs,
                Item=item,
                ConditionExpression="attribute_not_exists(#s)",
                ExpressionAttributeNames={"#s": K.LOG_SEQ},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            if key is not None:
                self._discard({key: text}, exc.response.get("Item"))

    def read_logs(self, inv_id: str, after: int, limit: int) -> list[LogEntry]:
        if limit <= 0:
            return []
        items = self._pages(
            self._ddb.query,
            limit=limit,
            TableName=self._logs,
            KeyConditionExpression="#i = :i AND #s > :after",
            ExpressionAttributeNames={"#i": K.LOG_INV, "#s": K.LOG_SEQ},
            ExpressionAttributeValues={":i": {"S": inv_id}, ":after": num(int(after))},
            ConsistentRead=True,
            Limit=limit,
        )
        out = []
        for item in list(items)[:limit]:
            if K.LOG_TEXT_REF in item:
                text = (self._fetch(item[K.LOG_TEXT_REF]["S"]) or b"").decode()
            else:
                text = item["text"]["S"]
            out.append(
                LogEntry(
                    seq=int(item[K.LOG_SEQ]["N"]),
                    stream=item["stream"]["S"],
                    text=text,
                    at=float(item["at"]["N"]),
                    attempt=int(item["attempt"]["N"]),
                )
            )
        return out

    def _delete_logs(self, inv_ids: Iterable[str]) -> None:
        """Every log entry of these invocations (one Query each, concurrently)."""
        ids = list(dict.fromkeys(inv_ids))
        if len(ids) <= 1:
            for inv_id in ids:
                self._delete_logs_of(inv_id)
            return
        with ThreadPoolExecutor(max_workers=min(_FAN_OUT, len(ids))) as pool:
            list(pool.map(self._delete_logs_of, ids))

    def _delete_logs_of(self, inv_id: str) -> None:
        items = list(
            self._pages(
                self._ddb.query,
                TableName=self._logs,
                KeyConditionExpression="#i = :i",
                ProjectionExpression="#i, #s, #r",
                ExpressionAttributeNames={"#i": K.LOG_INV, "#s": K.LOG_SEQ, "#r": K.LOG_TEXT_REF},
                ExpressionAttributeValues={":i": {"S": inv_id}},
            )
        )
        self._delete_items(
            self._logs, [{K.LOG_INV: i[K.LOG_INV], K.LOG_SEQ: i[K.LOG_SEQ]} for i in items]
        )
        self._delete_objects(i[K.LOG_TEXT_REF]["S"] for i in items if K.LOG_TEXT_REF in i)

    # --- blobs (S3) ---------------------------------------------------------------------
    def put_blob(self, digest: str, data: bytes, now: float) -> None:
        try:
            self._s3.put_object(
                Bucket=self._bucket, Key=K.blob_key(digest), Body=data, IfNoneMatch="*"
            )
        except ClientError as exc:
            # 412: stored already; 409: another put of it is under way
            if error_code(exc) not in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise

    def get_blob(self, digest: str) -> bytes | None:
        return self._fetch(K.blob_key(digest))

    def has_blobs(self, digests: Iterable[str]) -> set[str]:
        """One HeadObject per digest (concurrently): S3 has no batch existence check,
        and listing the prefix would read every blob's name."""
        wanted = list(dict.fromkeys(digests))
        if len(wanted) <= 1:
            return {d for d in wanted if self._has_blob(d)}
        with ThreadPoolExecutor(max_workers=min(_FAN_OUT, len(wanted))) as pool:
            found = list(pool.map(self._has_blob, wanted))
        return {d for d, ok in zip(wanted, found, strict=True) if ok}

    def _has_blob(self, digest: str) -> bool:
        key = K.blob_key(digest)
        try:
            head = self._s3.head_object(Bucket=self._bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        age = time.time() - head["LastModified"].timestamp()
        if self._blob_refresh_after is not None and age > self._blob_refresh_after:
            # re-stamp it, so the lifecycle rule does not take a blob that is in use
            self._s3.copy_object(
                Bucket=self._bucket,
                Key=key,
                CopySource={"Bucket": self._bucket, "Key": key},
                MetadataDirective="REPLACE",
            )
        return True

    def blob_url(self, method: str, digest: str, ttl: int) -> str:
        """A presigned S3 URL (SigV4) to ``GET`` or ``PUT`` one blob for ``ttl`` seconds.

        It stops working early if the signing credentials (a Lambda role's) expire
        first. S3 does not check that PUT bytes match the digest.
        """
        operations = {"GET": "get_object", "PUT": "put_object"}
        if method.upper() not in operations:
            raise ValueError(f"blob URLs are for GET or PUT, not {method!r}")
        if not 0 < ttl <= _MAX_URL_TTL:
            raise ValueError(f"a presigned URL lives 1 s to 7 days, not {ttl!r} s")
        url: str = self._s3.generate_presigned_url(
            operations[method.upper()],
            Params={"Bucket": self._bucket, "Key": K.blob_key(digest)},
            ExpiresIn=int(ttl),
            HttpMethod=method.upper(),
        )
        return url

    # --- S3 objects ----------------------------------------------------------------------
    def _fetch(self, key: str) -> bytes | None:
        try:
            out = self._s3.get_object(Bucket=self._bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) in ("NoSuchKey", "404"):
                return None
            raise
        data: bytes = out["Body"].read()
        return data

    def _upload(self, uploads: Mapping[str, bytes]) -> None:
        for key, data in uploads.items():
            self._s3.put_object(Bucket=self._bucket, Key=key, Body=data)

    def _discard(self, uploads: Mapping[str, bytes], item: Item | None) -> None:
        """Delete uploads a refused write left unreferenced."""
        kept = {v["S"] for v in (item or {}).values() if "S" in v and v["S"] in uploads}
        self._delete_objects(k for k in uploads if k not in kept)

    def _delete_objects(self, keys: Iterable[str]) -> None:
        batch = list(dict.fromkeys(keys))
        for start in range(0, len(batch), 1000):
            objects = [{"Key": k} for k in batch[start : start + 1000]]
            self._s3.delete_objects(Bucket=self._bucket, Delete={"Objects": objects, "Quiet": True})

    # --- DynamoDB plumbing ----------------------------------------------------------------
    def _pages(
        self, call: Any, *, limit: int | None = None, by_page: bool = False, **kwargs: Any
    ) -> Iterator[Any]:
        """Items (or pages of items) of a paginated Query/Scan, stopping once ``limit``
        items came back (a filter may make pages short or empty)."""
        seen = 0
        while True:
            out = call(**kwargs)
            items = out.get("Items", [])
            seen += len(items)
            if by_page:
                yield items
            else:
                yield from items
            if "LastEvaluatedKey" not in out or (limit is not None and seen >= limit):
                return
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]

    def _batch_get(self, table: str, keys: list[Item]) -> list[Item]:
        """BatchGetItem, 100 keys a request, strongly consistent, retrying what the
        service left unprocessed."""
        found: list[Item] = []
        for start in range(0, len(keys), 100):
            request = {table: {"Keys": keys[start : start + 100], "ConsistentRead": True}}
            attempt = 0
            while request:
                out = self._ddb.batch_get_item(RequestItems=request)
                found += out["Responses"].get(table, [])
                request = out.get("UnprocessedKeys") or {}
                if request:
                    attempt = _next_round(attempt)
        return found

    def _delete_items(self, table: str, keys: list[Item]) -> None:
        """BatchWriteItem deletes, 25 keys a request."""
        for start in range(0, len(keys), 25):
            request = {table: [{"DeleteRequest": {"Key": k}} for k in keys[start : start + 25]]}
            attempt = 0
            while request:
                out = self._ddb.batch_write_item(RequestItems=request)
                request = out.get("UnprocessedItems") or {}
                if request:
                    attempt = _next_round(attempt)
