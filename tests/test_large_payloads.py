"""Arguments and results over the inline limit travel as content-addressed blobs."""

from __future__ import annotations

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.wire import decode_payload, result_blob


def echo_len(data: bytes) -> int:
    return len(data)


def make_bytes(n: int) -> bytes:
    return b"z" * n


def test_a_large_argument_travels_as_a_blob(dispatch: dls.Dispatch) -> None:
    # Given a 1 MiB argument (the inline limit is 256 KiB)
    q = dls.SyncQueue("big", dispatch=dispatch)
    inv = q.submit(echo_len, b"a" * (1 << 20))
    # Then the stored payload is small and names the arguments' blob
    rec = dispatch.transport.get(inv)
    assert rec.payload is not None and len(rec.payload) < 1024
    env = decode_payload(rec.payload)
    assert "args" not in env
    assert dispatch.transport.missing_blobs([env["args_ref"]]) == set()
    # And the worker reads it back whole
    dls.run_worker(q, once=True)
    assert q.result(inv, timeout=10) == 1 << 20


def test_a_large_result_travels_as_a_blob(dispatch: dls.Dispatch) -> None:
    q = dls.SyncQueue("big-result", dispatch=dispatch)
    inv = q.submit(make_bytes, 1 << 20)
    dls.run_worker(q, once=True)
    rec = dispatch.transport.get(inv)
    assert rec.result is not None and result_blob(rec.result) is not None
    assert q.result(inv, timeout=10) == b"z" * (1 << 20)


def test_small_arguments_and_results_stay_inline(dispatch: dls.Dispatch) -> None:
    q = dls.SyncQueue("small", dispatch=dispatch)
    inv = q.submit(make_bytes, 10)
    dls.run_worker(q, once=True)
    rec = dispatch.transport.get(inv)
    assert rec.payload is not None and "args" in decode_payload(rec.payload)
    assert rec.result is not None and result_blob(rec.result) is None
    assert q.result(inv, timeout=10) == b"z" * 10
