"""The compatibility guard: a call a worker cannot load fails with both versions named."""

from __future__ import annotations

import pickle

import msgpack
import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.plane import Submission
from dreamlake.lakeshore.wire import encode_pickle_call


def double(x: int) -> int:
    return 2 * x


def test_a_newer_pickle_protocol_fails_with_both_versions_named(dispatch: dls.Dispatch) -> None:
    # Given a call that claims a pickle protocol and a Python newer than this worker's
    q = dls.SyncQueue("compat", dispatch=dispatch)
    q.submit(double, 1)  # makes the queue
    encoded = encode_pickle_call(double, (2,), {})
    env = msgpack.unpackb(encoded.payload)
    env.update(proto=pickle.HIGHEST_PROTOCOL + 1, py="3.99")
    dispatch.upload(encoded.blobs)
    sub = Submission(id="future", queue="compat", payload=msgpack.packb(env, use_bin_type=True))
    dispatch.transport.submit([sub])
    # When a worker runs the queue
    dls.run_worker(q, once=True)
    dls.run_worker(q, once=True)
    # Then the call fails, naming both sides and the way out
    with pytest.raises(dls.CannotLoad, match=r"Python 3\.99.*reads up to.*module:function"):
        q.result("future", timeout=10)
