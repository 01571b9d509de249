"""Build the store's tables and bucket from template.yaml's own resource definitions.

The template is the single source of truth: tests (under moto) and ``lakeshore dev``
create what its ``Properties`` say, translated property by property into the boto3
calls CloudFormation would make. A property this module does not know is an error, so
the template cannot grow something the local stacks silently leave out. (A real
account gets its tables from the deployed template, not from here.)

    from dreamlake.lakeshore.infra.tables import build_stack, moto_stack
    build_stack(dynamodb_client, s3_client, Resources(), region="us-east-1")
    with moto_stack() as (resources, dynamodb, s3): ...   # tests
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import yaml  # type: ignore[import-untyped]

from dreamlake.lakeshore.stores.keys import BUCKET_RESOURCE, TABLE_RESOURCES, Resources

__all__ = [
    "TEMPLATE",
    "bucket_calls",
    "build_stack",
    "create_bucket",
    "create_tables",
    "load_template",
    "moto_stack",
    "table_calls",
]

#: the stack's template: template.yaml beside this module is a link to the repository's
#: own in a checkout (resolved: the path is the repository's file, as SAM and cfn-lint
#: expect) and the file the wheel carries in its place in an installed package
TEMPLATE = (Path(__file__).resolve().parent / "template.yaml").resolve()

#: CloudFormation table properties that map one to one onto create_table arguments
_TABLE_ARGS = (
    "AttributeDefinitions",
    "KeySchema",
    "GlobalSecondaryIndexes",
    "LocalSecondaryIndexes",
    "BillingMode",
    "DeletionProtectionEnabled",
    "Tags",
)


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """YAML with CloudFormation's short tags (``!Ref X`` → ``{"Ref": "X"}``)."""


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = "Ref" if suffix == "Ref" else f"Fn::{suffix}"
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = str(value).split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {name: value}


_Loader.add_multi_constructor("!", _tag)


def load_template(path: Path = TEMPLATE) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.load(path.read_text(), Loader=_Loader)
    return doc


def _resolve(value: Any, params: Mapping[str, Any]) -> Any:
    """Parameters by ``Ref`` (given, else their defaults); other intrinsics are errors."""
    if isinstance(value, dict):
        if set(value) == {"Ref"} and value["Ref"] in params:
            return params[value["Ref"]]
        if any(k == "Ref" or k.startswith("Fn::") for k in value):
            raise ValueError(f"infra/tables.py cannot resolve {value!r}")
        return {k: _resolve(v, params) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, params) for v in value]
    return value


def _params(template: Mapping[str, Any], given: Mapping[str, Any] | None) -> dict[str, Any]:
    params = {n: p.get("Default") for n, p in template.get("Parameters", {}).items()}
    params.update(given or {})
    return params


def table_calls(
    template: Mapping[str, Any], logical_id: str, table_name: str
) -> list[tuple[str, dict[str, Any]]]:
    """The DynamoDB client calls (operation, kwargs) that build one table resource."""
    resource = template["Resources"][logical_id]
    if resource["Type"] != "AWS::DynamoDB::Table":
        raise ValueError(f"{logical_id} is not a DynamoDB table")
    props = _resolve(dict(resource["Properties"]), _params(template, None))
    create: dict[str, Any] = {"TableName": table_name}
    calls: list[tuple[str, dict[str, Any]]] = [("create_table", create)]
    for name, value in props.items():
        if name in _TABLE_ARGS:
            create[name] = value
        elif name == "TimeToLiveSpecification":
            calls.append(
                ("update_time_to_live", {"TableName": table_name, "TimeToLiveSpecification": value})
            )
        elif name == "PointInTimeRecoverySpecification":
            calls.append(
                (
                    "update_continuous_backups",
                    {"TableName": table_name, "PointInTimeRecoverySpecification": value},
                )
            )
        elif name == "SSESpecification":
            create["SSESpecification"] = {"Enabled": value.get("SSEEnabled", False)}
        else:
            raise ValueError(f"{logical_id}: property {name} is not translated by infra/tables.py")
    return calls


def _lifecycle_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"ID": rule["Id"], "Status": rule["Status"]}
    out["Filter"] = {"Prefix": rule.get("Prefix", "")}
    for name, value in rule.items():
        if name in ("Id", "Status", "Prefix"):
            continue
        if name == "ExpirationInDays":
            out["Expiration"] = {"Days": int(value)}
        elif name == "AbortIncompleteMultipartUpload":
            out[name] = {"DaysAfterInitiation": int(value["DaysAfterInitiation"])}
        else:
            raise ValueError(f"lifecycle rule field {name} is not translated by infra/tables.py")
    return out


def bucket_calls(
    template: Mapping[str, Any],
    bucket: str,
    region: str,
    parameters: Mapping[str, Any] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """The S3 client calls (operation, kwargs) that build the blob bucket."""
    resource = template["Resources"][BUCKET_RESOURCE]
    props = _resolve(dict(resource.get("Properties", {})), _params(template, parameters))
    create: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":
        create["CreateBucketConfiguration"] = {"LocationConstraint": region}
    calls: list[tuple[str, dict[str, Any]]] = [("create_bucket", create)]
    for name, value in props.items():
        if name == "PublicAccessBlockConfiguration":
            calls.append(
                (
                    "put_public_access_block",
                    {"Bucket": bucket, "PublicAccessBlockConfiguration": value},
                )
            )
        elif name == "BucketEncryption":
            rules = [
                {"ApplyServerSideEncryptionByDefault": r["ServerSideEncryptionByDefault"]}
                for r in value["ServerSideEncryptionConfiguration"]
            ]
            calls.append(
                (
                    "put_bucket_encryption",
                    {"Bucket": bucket, "ServerSideEncryptionConfiguration": {"Rules": rules}},
                )
            )
        elif name == "LifecycleConfiguration":
            rules = [_lifecycle_rule(r) for r in value["Rules"]]
            calls.append(
                (
                    "put_bucket_lifecycle_configuration",
                    {"Bucket": bucket, "LifecycleConfiguration": {"Rules": rules}},
                )
            )
        else:
            raise ValueError(f"BlobBucket: property {name} is not translated by infra/tables.py")
    return calls


def create_tables(
    dynamodb: Any, resources: Resources, template: Mapping[str, Any] | None = None
) -> None:
    """Create every table of the template (and wait until each is active)."""
    template = template or load_template()
    for logical_id, field in TABLE_RESOURCES.items():
        name = getattr(resources, field)
        for operation, kwargs in table_calls(template, logical_id, name):
            getattr(dynamodb, operation)(**kwargs)
            if operation == "create_table":
                dynamodb.get_waiter("table_exists").wait(
                    TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
                )


def create_bucket(
    s3: Any,
    resources: Resources,
    region: str,
    template: Mapping[str, Any] | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> None:
    template = template or load_template()
    for operation, kwargs in bucket_calls(template, resources.bucket, region, parameters):
        getattr(s3, operation)(**kwargs)


def build_stack(
    dynamodb: Any,
    s3: Any,
    resources: Resources,
    region: str,
    parameters: Mapping[str, Any] | None = None,
) -> None:
    """Tables and bucket as template.yaml defines them (parameters default as there)."""
    template = load_template()
    create_tables(dynamodb, resources, template)
    create_bucket(s3, resources, region, template, parameters)


# --- moto ----------------------------------------------------------------------------------
#: moto's conditional writes are not atomic under concurrent threads (AWS-NOTES): every
#: request through moto_stack's clients takes this lock. The real service needs none.
_MOTO_LOCK = threading.Lock()
_MOTO_CLIENTS: dict[str, tuple[Any, Any]] = {}
_DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


def _serialised(client: Any) -> Any:
    call = client._make_api_call

    def locked(operation: str, params: Any) -> Any:
        with _MOTO_LOCK:
            return call(operation, params)

    client._make_api_call = locked
    return client


@contextmanager
def moto_stack(region: str = "us-east-1") -> Iterator[tuple[Resources, Any, Any]]:
    """An in-process moto account with the template's tables and bucket.

    Yields ``(resources, dynamodb, s3)``. Credentials are dummies and the region is
    explicit, so nothing reaches a real account. The clients are made once per region
    and reused (making one costs ~0.1 s; moto serves whichever mock is active), and
    their requests are serialised (see ``_MOTO_LOCK``).
    """
    from moto import mock_aws

    from dreamlake.lakeshore.stores.dynamo import make_clients

    env = {**_DUMMY_ENV, "AWS_DEFAULT_REGION": region}
    with mock.patch.dict(os.environ, env), mock_aws():
        if region not in _MOTO_CLIENTS:
            ddb, s3 = make_clients(region_name=region)
            _MOTO_CLIENTS[region] = (_serialised(ddb), _serialised(s3))
        ddb, s3 = _MOTO_CLIENTS[region]
        resources = Resources()
        build_stack(ddb, s3, resources, region)
        yield resources, ddb, s3
