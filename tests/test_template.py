"""template.yaml is the single source of truth for the store's tables and bucket.

cfn-lint passes on it; the tables infra/tables.py builds from it (as moto and
``lakeshore dev`` use them) have exactly the keys, indexes and TTL attributes that
``lakeshore/stores/keys.py`` names; and a property the builder cannot translate is an
error rather than something a local stack silently leaves out.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dreamlake.lakeshore.stores import keys as K

pytest.importorskip("moto")
cfnlint_api = pytest.importorskip("cfnlint.api")

from infra.tables import (  # noqa: E402 (after the skips)
    TEMPLATE,
    bucket_calls,
    load_template,
    moto_stack,
    table_calls,
)


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[K.Resources, Any, Any]]:
    with moto_stack() as built:
        yield built


def _indexes(ddb: Any, table: str) -> dict[str, dict[str, Any]]:
    described = ddb.describe_table(TableName=table)["Table"]
    return {i["IndexName"]: i for i in described.get("GlobalSecondaryIndexes", [])}


def _keys(schema: list[dict[str, str]]) -> tuple[str, ...]:
    order = {"HASH": 0, "RANGE": 1}
    return tuple(k["AttributeName"] for k in sorted(schema, key=lambda k: order[k["KeyType"]]))


def test_cfn_lint_passes_on_the_template(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SAM transform inside cfn-lint needs a region
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    config = cfnlint_api.ManualArgs(regions=["us-east-1"], include_checks=["I"])
    matches = cfnlint_api.lint_file(TEMPLATE, config=config)
    assert [str(m) for m in matches] == []


def test_cfn_lint_catches_a_broken_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the template with an invalid billing mode (the lint really runs)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    broken = tmp_path / "template.yaml"
    text = TEMPLATE.read_text()
    broken.write_text(text.replace("PAY_PER_REQUEST", "PAY_LATER", 1))
    # Then cfn-lint reports it
    matches = cfnlint_api.lint_file(broken, config=cfnlint_api.ManualArgs(regions=["us-east-1"]))
    assert any("PAY_LATER" in str(m) for m in matches)


def test_the_template_declares_exactly_the_tables_the_code_names() -> None:
    resources = load_template()["Resources"]
    tables = {n for n, r in resources.items() if r["Type"] == "AWS::DynamoDB::Table"}
    assert tables == set(K.TABLE_RESOURCES)
    assert resources[K.BUCKET_RESOURCE]["Type"] == "AWS::S3::Bucket"


def test_the_invocations_table_has_exactly_the_indexes_keys_names(
    stack: tuple[K.Resources, Any, Any],
) -> None:
    resources, ddb, _ = stack
    indexes = _indexes(ddb, resources.invocations)
    assert set(indexes) == K.INVOCATION_INDEXES
    assert {name: _keys(i["KeySchema"]) for name, i in indexes.items()} == {
        K.PENDING_INDEX: (K.PENDING_PK, "order_key"),
        K.DUE_INDEX: (K.PENDING_PK, K.DUE_AT),
        K.LEASES_INDEX: (K.LEASE_PK, "lease_expires_at"),
        K.EXPIRY_INDEX: (K.PURGE_PK, "expires_at"),
        K.QUEUE_INDEX: ("queue", "id"),
    }
    # the pending index carries what a claim filters on and the payload renewal reads;
    # the leases index the renewal's attribute; the by-queue index nothing (keys only),
    # so only a group's creation writes its entry
    pending = indexes[K.PENDING_INDEX]["Projection"]
    assert pending["ProjectionType"] == "INCLUDE"
    assert K.PENDING_INDEX_ATTRS == K.PENDING_INCLUDE
    assert set(pending["NonKeyAttributes"]) == set(K.PENDING_INCLUDE)
    leases = indexes[K.LEASES_INDEX]["Projection"]
    assert set(leases["NonKeyAttributes"]) == set(K.LEASES_INCLUDE)
    for name in (K.QUEUE_INDEX, K.DUE_INDEX, K.EXPIRY_INDEX):
        assert indexes[name]["Projection"]["ProjectionType"] == "KEYS_ONLY"


def test_every_table_has_the_keys_the_code_uses(stack: tuple[K.Resources, Any, Any]) -> None:
    resources, ddb, _ = stack

    def key_of(table: str) -> tuple[str, ...]:
        return _keys(ddb.describe_table(TableName=table)["Table"]["KeySchema"])

    assert key_of(resources.queues) == (K.Q_NAME,)
    assert key_of(resources.invocations) == ("id",)
    assert key_of(resources.records) == (K.REC_KIND, K.REC_ID)
    assert key_of(resources.logs) == (K.LOG_INV, K.LOG_SEQ)
    for table in (resources.queues, resources.records, resources.logs):
        assert _indexes(ddb, table) == {}


@pytest.mark.parametrize("field", ["invocations", "logs"])
def test_ttl_is_on_the_attribute_keys_names(
    stack: tuple[K.Resources, Any, Any], field: str
) -> None:
    resources, ddb, _ = stack
    ttl = ddb.describe_time_to_live(TableName=getattr(resources, field))
    assert ttl["TimeToLiveDescription"]["AttributeName"] == K.PURGE_AT
    assert ttl["TimeToLiveDescription"]["TimeToLiveStatus"] == "ENABLED"


def test_tables_are_pay_per_request(stack: tuple[K.Resources, Any, Any]) -> None:
    resources, ddb, _ = stack
    for field in K.TABLE_RESOURCES.values():
        table = ddb.describe_table(TableName=getattr(resources, field))["Table"]
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"


def test_the_bucket_has_the_lifecycle_of_the_prefixes_keys_names(
    stack: tuple[K.Resources, Any, Any],
) -> None:
    resources, _, s3 = stack
    rules = s3.get_bucket_lifecycle_configuration(Bucket=resources.bucket)["Rules"]
    by_prefix = {r["Filter"].get("Prefix"): r for r in rules}
    # parameters resolve to their defaults
    assert by_prefix[K.BLOB_PREFIX]["Expiration"]["Days"] == 30
    assert by_prefix[K.INV_PREFIX]["Expiration"]["Days"] == 400
    # a blob re-stamped when found in use outlives the refresh period by weeks
    assert by_prefix[K.BLOB_PREFIX]["Expiration"]["Days"] * 86400 > 3 * K.BLOB_REFRESH_AFTER
    blocked = s3.get_public_access_block(Bucket=resources.bucket)
    assert all(blocked["PublicAccessBlockConfiguration"].values())


def test_the_api_function_may_write_read_and_presign_wake_objects_and_none_expires(
    stack: tuple[K.Resources, Any, Any],
) -> None:
    """Idle workers GET ``wake/<queue>`` by URLs the API function presigns (so its role
    needs GetObject there), a submit rewrites it (PutObject), a claim HEADs it (a
    missing one must answer 404, not 403: ListBucket). No lifecycle rule may expire it
    (a queue's object lives as long as the queue)."""
    import fnmatch

    template = load_template()
    function = template["Resources"]["ApiFunction"]["Properties"]
    assert {"Ref": "PlaneDataPolicy"} in function["Policies"]
    statements = template["Resources"]["PlaneDataPolicy"]["Properties"]["PolicyDocument"][
        "Statement"
    ]

    def allowed(action: str, resource: str) -> bool:
        for st in statements:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            names = [r.get("Fn::Sub", "").replace("${BlobBucket.Arn}", "bucket") for r in res]
            if {"Fn::GetAtt": ["BlobBucket", "Arn"]} in res:
                names.append("bucket")
            matches = any(fnmatch.fnmatchcase(resource, n) for n in names if n)
            if st["Effect"] == "Allow" and action in actions and matches:
                return True
        return False

    key = f"bucket/{K.wake_key('some-queue')}"
    assert allowed("s3:GetObject", key) and allowed("s3:PutObject", key)
    assert allowed("s3:DeleteObject", key) and allowed("s3:ListBucket", "bucket")
    resources, _, s3 = stack
    rules = s3.get_bucket_lifecycle_configuration(Bucket=resources.bucket)["Rules"]
    prefixes = [r["Filter"].get("Prefix", "") for r in rules if "Expiration" in r]
    assert not [p for p in prefixes if K.wake_key("q").startswith(p)]


def test_a_table_property_the_builder_does_not_know_is_an_error() -> None:
    # Given the template with a property infra/tables.py does not translate
    template = copy.deepcopy(load_template())
    template["Resources"]["QueuesTable"]["Properties"]["StreamSpecification"] = {
        "StreamViewType": "NEW_IMAGE"
    }
    # Then building the table refuses instead of leaving it out
    with pytest.raises(ValueError, match="StreamSpecification"):
        table_calls(template, "QueuesTable", "t")


def test_a_bucket_property_the_builder_does_not_know_is_an_error() -> None:
    template = copy.deepcopy(load_template())
    template["Resources"][K.BUCKET_RESOURCE]["Properties"]["VersioningConfiguration"] = {
        "Status": "Enabled"
    }
    with pytest.raises(ValueError, match="VersioningConfiguration"):
        bucket_calls(template, "b", "us-east-1")


def test_bucket_parameters_can_be_given() -> None:
    calls = dict(bucket_calls(load_template(), "b", "eu-west-1", {"BlobRetentionDays": 9}))
    rules = calls["put_bucket_lifecycle_configuration"]["LifecycleConfiguration"]["Rules"]
    assert {r["Filter"]["Prefix"]: r.get("Expiration") for r in rules}[K.BLOB_PREFIX] == {"Days": 9}
    assert calls["create_bucket"]["CreateBucketConfiguration"] == {
        "LocationConstraint": "eu-west-1"
    }


def test_lakeshore_dev_blocks_a_wait_as_long_as_the_deployed_api_function() -> None:
    from dreamlake.lakeshore.devstack import STACK_MAX_WAIT, DevServer

    default = load_template()["Parameters"]["MaxWaitSeconds"]["Default"]
    assert default == STACK_MAX_WAIT
    assert DevServer(lambda: None).limits().max_wait == default  # type: ignore[arg-type,return-value]
