"""``Dispatch("aws://<stack>")``: producers and workers that reach the stack's DynamoDB
tables and S3 bucket directly, with IAM credentials and no API in between.

Everything runs against the moto server a dev stack starts (``?endpoint=``): names come
from the environment (``aws://env``) or from a CloudFormation stack's Outputs; the
aioboto3 read path (``AwsPlane.probe``) is checked against the same server.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.awsdirect import STACK_OUTPUTS, AsyncDynamoProbe, AwsPlane, AwsTarget
from dreamlake.lakeshore.devstack import dev_in_thread
from dreamlake.lakeshore.infra.tables import load_template
from dreamlake.lakeshore.plane import State
from dreamlake.lakeshore.stores import keys as K

pytestmark = pytest.mark.timeout(120)

REGION = "us-east-1"


def big(n: int) -> dict[str, str]:
    return {"s": "x" * n}


def boom() -> None:
    raise KeyError("no such thing")


@pytest.fixture(scope="module")
def dev() -> Iterator[tuple[str, str, str]]:
    """A dev stack (its moto server holds the template's tables under default names);
    the environment names no tables, so ``aws://env`` means those defaults."""
    clean = {k: v for k, v in os.environ.items() if k not in K.ENV_VARS}
    with mock.patch.dict(os.environ, clean, clear=True), dev_in_thread() as running:
        yield running


@pytest.fixture(scope="module")
def target(dev: tuple[str, str, str]) -> str:
    return f"aws://env?region={REGION}&endpoint={dev[2]}"


@pytest.fixture(scope="module")
def worker(target: str) -> Iterator[None]:
    """A worker thread on its own aws:// Dispatch, serving the queue ``direct``."""
    done = threading.Event()
    with dls.Dispatch(target) as dp:
        thread = threading.Thread(
            target=dls.run_worker,
            args=(dls.SyncQueue("direct", dispatch=dp),),
            kwargs={"stop": done.is_set, "poll": 0.05},
            daemon=True,
        )
        thread.start()
        yield
        done.set()
        thread.join(timeout=10)


@pytest.fixture
def producer(target: str) -> Iterator[dls.Dispatch]:
    with dls.Dispatch(target) as dp:
        yield dp


# --- targets ---------------------------------------------------------------------------


def test_targets_parse_into_stack_region_endpoint_and_profile() -> None:
    assert AwsTarget.parse("aws://my-stack") == AwsTarget("my-stack")
    parsed = AwsTarget.parse("aws://env?region=eu-west-1&endpoint=http://127.0.0.1:5000")
    assert parsed == AwsTarget("env", "eu-west-1", "http://127.0.0.1:5000")
    assert parsed.local
    assert not AwsTarget.parse("aws://s?endpoint=https://dynamodb.example.com").local
    assert AwsTarget.parse("aws://s?profile=ops").profile == "ops"
    for bad, why in [
        ("aws://", "aws://<stack"),
        ("aws://s/extra", "aws://<stack"),
        ("aws://s?colour=red", "unknown aws:// option"),
        ("aws://s?region=a&region=b", "one value"),
        ("aws://s?region=", "one value"),
        ("aws://s?endpoint=ftp://x", "http"),
    ]:
        with pytest.raises(ValueError, match=why):
            AwsTarget.parse(bad)


def test_a_token_or_a_missing_region_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(TypeError, match="IAM credentials, not a token"):
        dls.Dispatch("aws://env?region=us-east-1", token="lks_x_y")
    # no region anywhere: not in the target, the environment or the AWS config
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_REGION", "AWS_DEFAULT_REGION")}
    env["AWS_CONFIG_FILE"] = str(tmp_path / "none")
    env.pop("AWS_PROFILE", None)
    with mock.patch.dict(os.environ, env, clear=True), pytest.raises(ValueError, match="region"):
        dls.Dispatch("aws://env")


def test_the_template_outputs_every_name_aws_targets_read() -> None:
    # Each output is "<logical id>Name" and refers to that resource (the functions get
    # the same names as environment variables; aws://<stack> reads them back).
    outputs = load_template()["Outputs"]
    for logical in [*K.TABLE_RESOURCES, K.BUCKET_RESOURCE]:
        assert outputs[f"{logical}Name"]["Value"] == {"Ref": logical}
    assert set(STACK_OUTPUTS) == {
        f"{logical}Name" for logical in [*K.TABLE_RESOURCES, K.BUCKET_RESOURCE]
    }


# --- submit, work, results ---------------------------------------------------------------


def test_a_producer_and_a_worker_meet_on_dynamodb_without_the_api(
    producer: dls.Dispatch, worker: None
) -> None:
    # Given an aws:// producer (the plane core in this process, over DynamoDB and S3)
    assert isinstance(producer.transport, AwsPlane)
    q = dls.SyncQueue("direct", dispatch=producer)
    # When it submits plain, offloaded (> 4 KB inline) and blob-sized (> 256 KiB) results
    ids = [q.submit("math:sqrt", float(i * i)) for i in range(8)]
    sized = [q.submit(big, 10_000), q.submit(big, 300_000)]
    failing = q.submit(boom)
    # Then the aws:// worker thread runs them and the results come back
    assert [q.result(i, timeout=30) for i in ids] == [float(i) for i in range(8)]
    assert [len(q.result(i, timeout=30)["s"]) for i in sized] == [10_000, 300_000]
    with pytest.raises(KeyError, match="no such thing"):
        q.result(failing, timeout=30)
    # and the async surface works on the same transport (its waits run on plane threads)
    aq = dls.Queue("direct", dispatch=producer)

    async def gather() -> list[Any]:
        return await asyncio.gather(*(aq.result(i, timeout=30) for i in ids))

    assert asyncio.run(gather()) == [float(i) for i in range(8)]


def test_an_http_producer_and_a_direct_worker_share_one_plane(
    dev: tuple[str, str, str], worker: None
) -> None:
    # Given a producer on the dev stack's HTTP API with its token
    url, admin, _ = dev
    with dls.Dispatch(url, token=admin) as over_http:
        q = dls.SyncQueue("direct", dispatch=over_http)
        # When it submits, the aws:// worker (same tables, no API) runs the job
        inv = q.submit("math:sqrt", 49.0)
        assert q.result(inv, timeout=30) == 7.0


# --- the aioboto3 path ---------------------------------------------------------------------


def test_the_async_probe_reads_results_with_aioboto3_without_blocking_the_loop(
    producer: dls.Dispatch, worker: None
) -> None:
    plane = producer.transport
    assert isinstance(plane, AwsPlane)
    q = dls.SyncQueue("direct", dispatch=producer)
    ids = [q.submit("math:sqrt", float(i * i)) for i in range(20)]
    sized = [q.submit(big, 10_000), q.submit(big, 300_000)]
    failing = q.submit(boom)
    stalled = dls.SyncQueue("nobody-serves-this", dispatch=producer).submit("math:sqrt", 1.0)
    polls = 0
    original = AsyncDynamoProbe._poll

    async def counted(self: AsyncDynamoProbe, watch: Any) -> None:
        nonlocal polls
        polls += 1
        await original(self, watch)

    async def main() -> None:
        # Twenty results awaited together share one poll (one BatchGetItem per round)
        values = await asyncio.gather(*(plane.aresult(i, 30) for i in ids))
        assert values == [float(i) for i in range(20)]
        assert polls == 1
        # offloaded results and result blobs are read from S3 on aioboto3
        assert [len(v["s"]) for v in await asyncio.gather(*map(plane.aresult, sized))] == [
            10_000,
            300_000,
        ]
        # a raise comes back as its own type; unknown ids and timeouts are errors
        with pytest.raises(KeyError, match="no such thing"):
            await plane.aresult(failing, 30)
        with pytest.raises(dls.UnknownInvocation):
            await plane.aresult("no-such-id", 30)
        # while a wait is under way the event loop keeps running other work
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(ticker())
        with pytest.raises(TimeoutError, match="keep going"):
            await plane.aresult(stalled, 1.0)
        ticking.cancel()
        assert ticks > 30
        rec = await plane.probe.get(stalled)
        assert rec.state is State.PENDING and rec.payload is None  # records come without payload

    with mock.patch.object(AsyncDynamoProbe, "_poll", counted):
        asyncio.run(main())


# --- stack outputs ----------------------------------------------------------------------------


def test_a_stack_name_resolves_tables_and_bucket_from_its_outputs(
    dev: tuple[str, str, str], worker: None
) -> None:
    import boto3

    moto = dev[2]
    session = boto3.Session(
        aws_access_key_id="test", aws_secret_access_key="test", region_name=REGION
    )
    cfn = session.client("cloudformation", endpoint_url=moto)
    names = K.Resources()
    outputs = {key: {"Value": getattr(names, field)} for key, field in STACK_OUTPUTS.items()}
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}, "Outputs": outputs}
    cfn.create_stack(StackName="lakeshore-test", TemplateBody=json.dumps(template))
    partial = {**template, "Outputs": {"QueuesTableName": outputs["QueuesTableName"]}}
    cfn.create_stack(StackName="not-lakeshore", TemplateBody=json.dumps(partial))
    cfn.close()
    options = f"region={REGION}&endpoint={moto}"
    # Given the stack's name, the names come from DescribeStacks
    with dls.Dispatch(f"aws://lakeshore-test?{options}") as dp:
        assert isinstance(dp.transport, AwsPlane)
        assert dp.transport.resources == names
        q = dls.SyncQueue("direct", dispatch=dp)
        assert q.result(q.submit("math:sqrt", 64.0), timeout=30) == 8.0
    # and a stack without them, or no stack, is a clear error
    with pytest.raises(ValueError, match=r"no output .*InvocationGroupsTableName"):
        dls.Dispatch(f"aws://not-lakeshore?{options}")
    with pytest.raises(ValueError, match="does not exist"):
        dls.Dispatch(f"aws://no-such-stack?{options}")
