"""The fan-out example against a deployed stack (opt-in: a real AWS account).

Run with ``LAKESHORE_AWS_STACK=<stack name>`` and AWS credentials that may describe the
stack and write its records table (as ``lakeshore bootstrap`` needs)::

    LAKESHORE_AWS_STACK=lakeshore AWS_REGION=eu-west-1 pytest -m aws tests/test_aws_deployed.py

A token comes from ``LAKESHORE_AWS_TOKEN`` when set; otherwise the test mints a
temporary admin token in the records table (as ``bootstrap --force-new`` does) and
revokes it at the end. Without a stack name or credentials the test is skipped.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dreamlake.lakeshore as dls

pytestmark = [pytest.mark.aws, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
STACK_ENV = "LAKESHORE_AWS_STACK"
TOKEN_ENV = "LAKESHORE_AWS_TOKEN"


@dataclass
class Deployed:
    url: str
    token: str


def _session() -> Any:
    if not os.environ.get(STACK_ENV):
        pytest.skip(f"set {STACK_ENV} to a deployed stack's name (and AWS credentials) to run")
    boto3 = pytest.importorskip("boto3")
    session = boto3.Session()
    if session.get_credentials() is None:
        pytest.skip("no AWS credentials (aws configure, AWS_PROFILE or AWS_ACCESS_KEY_ID)")
    if session.region_name is None:
        pytest.skip("no AWS region (AWS_REGION or your AWS configuration)")
    return session


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployed]:
    session = _session()
    from dreamlake.lakeshore.api.auth import create_token
    from dreamlake.lakeshore.cli.deploy import API_URL_OUTPUT, STACK_OUTPUTS, stack_outputs
    from dreamlake.lakeshore.plane import Plane
    from dreamlake.lakeshore.stores.dynamo import DynamoStore, make_clients
    from dreamlake.lakeshore.stores.keys import Resources

    outputs = stack_outputs(session.client("cloudformation"), os.environ[STACK_ENV])
    url = outputs[API_URL_OUTPUT]
    given = os.environ.get(TOKEN_ENV)
    if given:
        yield Deployed(url, given)
        return
    names = {field: outputs[key] for key, field in STACK_OUTPUTS.items()}
    dynamodb, s3 = make_clients(session=session)
    plane = Plane(DynamoStore(Resources(**names), dynamodb=dynamodb, s3=s3))
    token, record = create_token(plane, "admin", name="tests/test_aws_deployed.py")
    try:
        yield Deployed(url, token)
    finally:
        record.revoked_at = plane.now()
        plane.store.put_token(record)
        plane.close()


def _fan_out_example() -> Any:
    spec = importlib.util.spec_from_file_location("fan_out", ROOT / "examples" / "fan_out.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fan_out_example_runs_against_the_deployed_plane(deployed: Deployed) -> None:
    # Given the seed's fan-out example and a worker thread, both on the deployed plane
    example = _fan_out_example()
    dp = dls.Dispatch(deployed.url, token=deployed.token)
    assert dp.transport.hello()["identity"]["role"] == "admin"  # type: ignore[attr-defined]
    done = threading.Event()
    worker = threading.Thread(
        target=dls.run_worker,
        args=(dls.SyncQueue("fan-out-demo", dispatch=dp),),
        kwargs={"stop": done.is_set},
        daemon=True,
    )
    worker.start()
    try:
        # When ten squares fan out and are gathered
        results = asyncio.run(example.fan_out(10, dp))
    finally:
        done.set()
        worker.join(timeout=30)
        dp.delete_queue("fan-out-demo", force=True)
        dp.close()
    # Then every result came back, in submission order
    assert results == [i * i for i in range(10)]
