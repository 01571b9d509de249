"""The AWS stack: template.yaml's API, functions and IAM, their build, and the Lambda
handlers over the DynamoDB + S3 store under moto, with the faults AWS really has.

- cfn-lint passes on the template and on its SAM → CloudFormation transform;
- the HTTP API routes exactly the handler's ROUTES; timeouts, runtime and build agree;
- the functions' policy allows every call the store makes, on the stack's own tables
  and bucket only, and the API's per-route permissions fit Lambda's policy size;
- the build target lays the package out as Lambda imports it;
- the Lambda handler, with the environment the template sets, runs a job end to end,
  and the sweeper hands an expired lease back;
- throttling, S3 5xx, a lost answer and two racing claimers are injected with botocore
  event hooks: what is safe is retried, the rest is a 503 with Retry-After, and no
  invocation is lost or duplicated;
- ``lakeshore deploy`` and ``lakeshore bootstrap``.
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import importlib
import json
import math
import os
import re
import subprocess
import sys
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import msgpack
import pytest
from typer.testing import CliRunner

from dreamlake.lakeshore.api import Service, authenticate, bootstrap_admin
from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.handlers import api as api_handler
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.plane import Plane, QueueSpec, State, Submission
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.stores import keys as K
from dreamlake.lakeshore.wire import (
    decode_payload,
    encode_pickle_call,
    encode_ref_call,
    encode_result,
)

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")
cfnlint_api = pytest.importorskip("cfnlint.api")
samtranslator = pytest.importorskip("samtranslator.translator.transform")

from botocore.awsrequest import AWSResponse  # noqa: E402 (after the skips)
from botocore.exceptions import EndpointConnectionError  # noqa: E402
from botocore.retries.standard import ExponentialBackoff  # noqa: E402
from moto.core.botocore_stubber import BotocoreStubber, MockRawResponse  # noqa: E402

from dreamlake.lakeshore.cli.deploy import bootstrap, deploy  # noqa: E402
from dreamlake.lakeshore.handlers import aws as aws_handler  # noqa: E402
from dreamlake.lakeshore.handlers import sweeper  # noqa: E402
from dreamlake.lakeshore.stores.dynamo import DynamoStore  # noqa: E402
from infra.tables import TEMPLATE, load_template, moto_stack  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's
MP = "application/msgpack"
T0 = 1_700_000_000.0  # long ago: a lease taken then has expired now
FUNCTIONS = ("ApiFunction", "SweeperFunction")


# --- the template ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


@pytest.fixture(scope="module")
def routes() -> set[tuple[str, str]]:
    """The handler's routes (make_app records them in ROUTES)."""
    plane = Plane(SqliteStore(":memory:"))
    api_handler.make_app(Service(plane))
    plane.close()
    return set(api_handler.ROUTES)


@pytest.fixture(scope="module")
def transformed() -> dict[str, Any]:
    """template.yaml through the SAM transform, as CloudFormation receives it (after
    ``sam package`` has put the code in S3)."""
    from samtranslator.yaml_helper import yaml_parse

    class NoManagedPolicies:  # the template names no AWS managed policy by name
        def load(self) -> dict[str, str]:
            return {}

    doc = yaml_parse(TEMPLATE.read_text())
    doc["Globals"]["Function"]["CodeUri"] = "s3://lakeshore-artifacts/code.zip"
    with mock.patch.dict(os.environ, {"AWS_DEFAULT_REGION": REGION}):
        out: dict[str, Any] = samtranslator.transform(doc, {}, NoManagedPolicies())
    return out


def _lint(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    config = cfnlint_api.ManualArgs(regions=[REGION], include_checks=["I"])
    return [str(m) for m in cfnlint_api.lint_file(path, config=config)]


def test_cfn_lint_passes_on_the_template(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _lint(TEMPLATE, monkeypatch) == []


def test_cfn_lint_passes_on_the_sam_transform(
    transformed: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "transformed.json"
    path.write_text(json.dumps(transformed))
    assert _lint(path, monkeypatch) == []


def _event_line(method: str, path: str) -> str:
    name = method.capitalize() + "".join(
        s.strip("{}")[:1].upper() + s.strip("{}")[1:] for s in path.split("/")[2:]
    )
    props = f'ApiId: !Ref HttpApi, Method: {method}, Path: "{path}"'
    return f"        {name}: {{Type: HttpApi, Properties: {{{props}}}}}"


def test_every_handler_route_is_a_route_of_the_http_api(
    template: dict[str, Any], routes: set[tuple[str, str]]
) -> None:
    events = template["Resources"]["ApiFunction"]["Properties"]["Events"].values()
    api_events = [e for e in events if e["Type"] == "HttpApi"]
    routed = {(e["Properties"]["Method"].upper(), e["Properties"]["Path"]) for e in api_events}
    missing = sorted(routes - routed)
    assert not missing, "add to ApiFunction's Events:\n" + "\n".join(
        _event_line(m, p) for m, p in missing
    )
    assert routed == routes, f"routes no handler answers: {sorted(routed - routes)}"
    assert all(e["Properties"]["ApiId"] == {"Ref": "HttpApi"} for e in api_events)


def test_the_deployed_api_routes_each_route_to_the_function_with_payload_v2(
    transformed: dict[str, Any], routes: set[tuple[str, str]]
) -> None:
    paths = transformed["Resources"]["HttpApi"]["Properties"]["Body"]["paths"]
    deployed = {(m.upper(), p) for p, ops in paths.items() for m in ops}
    assert deployed == routes
    for ops in paths.values():
        for op in ops.values():
            integration = op["x-amazon-apigateway-integration"]
            assert integration["payloadFormatVersion"] == "2.0"
            assert "${ApiFunction.Arn}" in integration["uri"]["Fn::Sub"]
            # API Gateway's own limit (30 s) stays above the function's timeout
            assert integration.get("timeoutInMillis", 30_000) == 30_000


def test_functions_runtime_timeouts_and_build(template: dict[str, Any]) -> None:
    glob = template["Globals"]["Function"]
    assert (glob["Runtime"], glob["Architectures"], glob["CodeUri"]) == (
        "python3.12",
        ["arm64"],
        ".",
    )
    resources = template["Resources"]
    for name in FUNCTIONS:
        fn = resources[name]
        assert fn["Metadata"] == {"BuildMethod": "makefile"}
        module, _, attr = fn["Properties"]["Handler"].rpartition(".")
        assert callable(getattr(importlib.import_module(module), attr))
    api = resources["ApiFunction"]["Properties"]
    wait = template["Parameters"]["MaxWaitSeconds"]
    # the HTTP API gives up at 30 s; a claim or wait must end well inside the function's time
    assert api["Timeout"] <= 29
    assert wait["Default"] <= 5 and wait["MaxValue"] + 5 <= api["Timeout"]
    assert api["Environment"]["Variables"][aws_handler.ENV_MAX_WAIT] == {"Ref": "MaxWaitSeconds"}
    schedule = resources["SweeperFunction"]["Properties"]["Events"]["EveryMinute"]
    assert schedule["Properties"]["Schedule"] == "rate(1 minute)"
    assert resources["SweeperFunction"]["Properties"]["Timeout"] < 60


def test_outputs_name_the_url_and_everything_bootstrap_reads(template: dict[str, Any]) -> None:
    from dreamlake.lakeshore.cli.deploy import API_URL_OUTPUT, STACK_OUTPUTS

    outputs = template["Outputs"]
    assert outputs[API_URL_OUTPUT]["Value"] == {"Fn::GetAtt": ["HttpApi", "ApiEndpoint"]}
    by_field = {**{f: t for t, f in K.TABLE_RESOURCES.items()}, "bucket": K.BUCKET_RESOURCE}
    for key, fld in STACK_OUTPUTS.items():
        assert outputs[key]["Value"] == {"Ref": by_field[fld]}


# --- IAM ---------------------------------------------------------------------------------

#: store client method → the IAM actions it needs (a new method must be added here)
_ACTIONS = {
    "dynamodb": {
        "get_item": ["GetItem"],
        "batch_get_item": ["BatchGetItem"],
        "query": ["Query"],
        "scan": ["Scan"],
        "put_item": ["PutItem"],
        "update_item": ["UpdateItem"],
        "delete_item": ["DeleteItem"],
        "batch_write_item": ["BatchWriteItem"],
        "transact_write_items": ["UpdateItem", "ConditionCheckItem"],
    },
    "s3": {
        "get_object": ["GetObject"],
        "head_object": ["GetObject", "ListBucket"],
        "put_object": ["PutObject"],
        "copy_object": ["GetObject", "PutObject"],
        "delete_objects": ["DeleteObject"],
        "generate_presigned_url": ["GetObject", "PutObject"],
    },
}
_NOT_CALLS = {"close", "meta", "exceptions", "get_waiter", "get_paginator"}


def _statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    policy = template["Resources"]["PlaneDataPolicy"]["Properties"]["PolicyDocument"]
    out = []
    for st in policy["Statement"]:
        actions, res = st["Action"], st["Resource"]
        out.append(
            {
                "actions": set(actions if isinstance(actions, list) else [actions]),
                "resources": res if isinstance(res, list) else [res],
            }
        )
    return out


def test_both_functions_get_exactly_the_plane_policy(transformed: dict[str, Any]) -> None:
    for name in FUNCTIONS:
        role = transformed["Resources"][f"{name}Role"]["Properties"]
        assert role["ManagedPolicyArns"] == [
            "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
            {"Ref": "PlaneDataPolicy"},
        ]
        assert "Policies" not in role


def test_the_policy_allows_every_call_the_store_code_makes(template: dict[str, Any]) -> None:
    allowed = set().union(*(st["actions"] for st in _statements(template)))
    attrs = {"_ddb": "dynamodb", "_s3": "s3"}
    used: set[tuple[str, str]] = set()
    for source in (ROOT / "lakeshore" / "stores").glob("dynamo*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in attrs
                and node.attr not in _NOT_CALLS
            ):
                used.add((attrs[node.value.attr], node.attr))
    unknown = sorted(f"{s}.{m}" for s, m in used if m not in _ACTIONS[s])
    assert not unknown, f"map these store calls to IAM actions in _ACTIONS: {unknown}"
    needed = {f"{s}:{a}" for s, m in used for a in _ACTIONS[s][m]}
    assert needed <= allowed, f"PlaneDataPolicy lacks {sorted(needed - allowed)}"
    assert not any("*" in a for a in allowed)


def test_the_api_route_permissions_fit_lambdas_policy_size(transformed: dict[str, Any]) -> None:
    # Each HttpApi event is one resource-policy statement on the function; Lambda caps
    # the policy at 20 KB. Sized with long names: a stack name of 40 characters.
    total = 0
    for logical_id, res in transformed["Resources"].items():
        props = res["Properties"]
        if res["Type"] != "AWS::Lambda::Permission" or props["FunctionName"] != {
            "Ref": "ApiFunction"
        }:
            continue
        arn = props["SourceArn"]["Fn::Sub"][0]
        for var, value in {
            "${AWS::Partition}": "aws",
            "${AWS::Region}": "ap-southeast-2",
            "${AWS::AccountId}": ACCOUNT,
            "${__ApiId__}": "abcdefghij",
            "${__Stage__}": "*",
        }.items():
            arn = arn.replace(var, value)
        statement = {
            "Sid": f"{'s' * 40}-{logical_id}-ABCDEFGHIJKL",
            "Effect": "Allow",
            "Principal": {"Service": "apigateway.amazonaws.com"},
            "Action": "lambda:InvokeFunction",
            "Resource": f"arn:aws:lambda:ap-southeast-2:{ACCOUNT}:function:{'s' * 40}-ApiFunc-X",
            "Condition": {"ArnLike": {"AWS:SourceArn": arn}},
        }
        total += len(json.dumps(statement, separators=(",", ":")))
    assert 0 < total < 20 * 1024 * 0.9


def _arn(ref: Any, resources: K.Resources) -> str:
    """A policy resource (GetAtt/Sub of the stack's tables and bucket) as moto's ARN."""
    names = {t: getattr(resources, f) for t, f in K.TABLE_RESOURCES.items()}
    arns = {f"{t}.Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{n}" for t, n in names.items()}
    arns[f"{K.BUCKET_RESOURCE}.Arn"] = f"arn:aws:s3:::{resources.bucket}"
    if "Fn::GetAtt" in ref:
        return arns[".".join(ref["Fn::GetAtt"])]
    return re.sub(r"\$\{([\w.]+)\}", lambda m: arns[m.group(1)], ref["Fn::Sub"])


def _requests(service: str, op: str, params: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(IAM action, resource ARN) pairs one API call is authorised on."""
    if service == "s3":
        bucket = f"arn:aws:s3:::{params['Bucket']}"
        if op == "DeleteObjects":
            for obj in params["Delete"]["Objects"]:
                yield "s3:DeleteObject", f"{bucket}/{obj['Key']}"
        elif op == "HeadObject":
            yield "s3:GetObject", f"{bucket}/{params['Key']}"
        else:
            yield f"s3:{op}", f"{bucket}/{params['Key']}"
        return
    table = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/"
    if op in ("BatchGetItem", "BatchWriteItem"):
        for name in params["RequestItems"]:
            yield f"dynamodb:{op}", table + name
    elif op == "TransactWriteItems":
        for item in params["TransactItems"]:
            ((kind, action),) = item.items()
            yield f"dynamodb:{kind}Item".replace("ItemItem", "Item"), table + action["TableName"]
    elif "IndexName" in params:
        yield f"dynamodb:{op}", f"{table}{params['TableName']}/index/{params['IndexName']}"
    else:
        yield f"dynamodb:{op}", table + params["TableName"]


def assert_allowed(
    calls: list[tuple[str, str, dict[str, Any]]], template: dict[str, Any], res: K.Resources
) -> None:
    """Every recorded call is allowed by PlaneDataPolicy on its own table, index or key."""
    statements = [
        (st["actions"], [_arn(r, res) for r in st["resources"]]) for st in _statements(template)
    ]
    denied = []
    for service, op, params in calls:
        for action, arn in _requests(service, op, params):
            if not any(
                action in acts and any(fnmatch.fnmatchcase(arn, p) for p in arns)
                for acts, arns in statements
            ):
                denied.append(f"{action} on {arn}")
    assert calls and not denied, sorted(set(denied))


# --- the handlers under moto ------------------------------------------------------------


@dataclass
class Faults:
    """Faults injected where moto answers botocore (its ``before-send`` stubber), so an
    injected failure never reaches moto, and every attempt of botocore's retries meets
    it; plus ``needs-retry`` and ``before-parameter-build`` hooks on the handler's session.
    """

    #: (service, operation, table or "") → (HTTP status, error code, how many more times)
    errors: dict[tuple[str, str, str], tuple[int, str, float]] = field(default_factory=dict)
    #: (service, operation, table) → successful answers still to lose (botocore resends)
    lose: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    #: the same, counting only conditional writes (a group's, not a payload item's)
    lose_guarded: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    #: (service, operation, table or "") → requests sent (each attempt)
    sent: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    #: every call the handler's clients made: (service, operation, parameters)
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    #: run before the next request of (service, operation, table) is sent
    before: dict[tuple[str, str, str], Callable[[], None]] = field(default_factory=dict)

    def fail(
        self, service: str, op: str, status: int, code: str, *, table: str = "", times: float = 1e9
    ) -> None:
        """Answer ``op`` (on ``table``, or any) with this error ``times`` times; status 0
        is no answer at all (the endpoint cannot be reached)."""
        self.errors[(service, op, table)] = (status, code, times)

    def install(self, session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        moto_send = BotocoreStubber.__call__

        def send(stub: Any, event_name: str, request: Any, **kw: Any) -> AWSResponse | None:
            injected = self._send(request, event_name)
            return injected if injected is not None else moto_send(stub, event_name, request, **kw)

        monkeypatch.setattr(BotocoreStubber, "__call__", send)
        session.events.register_first("needs-retry", self._needs_retry)
        session.events.register("before-parameter-build", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append((model.service_model.endpoint_prefix, model.name, dict(params)))

    @staticmethod
    def _table(service: str, body: Any) -> str:
        return str(json.loads(body).get("TableName", "")) if service == "dynamodb" and body else ""

    def _send(self, request: Any, event_name: str) -> AWSResponse | None:
        _, service, op = event_name.split(".")
        table = self._table(service, request.body)
        self.sent[(service, op, table)] += 1
        run = self.before.pop((service, op, table), None)
        if run is not None:
            run()
        key = next((k for k in ((service, op, table), (service, op, "")) if k in self.errors), None)
        if key is None or self.errors[key][2] <= 0:
            return None
        status, code, times = self.errors[key]
        self.errors[key] = (status, code, times - 1)
        if status == 0:
            raise EndpointConnectionError(endpoint_url=request.url)
        if service == "dynamodb":
            body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}"})
        else:
            body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>"
        return AWSResponse(request.url, status, {}, MockRawResponse(body))

    def _needs_retry(
        self, response: Any, event_name: str, request_dict: dict[str, Any], **_: Any
    ) -> float | None:
        _, service, op = event_name.split(".")
        key = (service, op, self._table(service, request_dict.get("body")))
        if response is None or response[0].status_code >= 300:
            return None
        guarded = b"ConditionExpression" in (request_dict.get("body") or b"")
        for lose in (self.lose, self.lose_guarded) if guarded else (self.lose,):
            if lose[key]:
                lose[key] -= 1
                return 0.0  # botocore resends a request that had in fact succeeded
        return None


def function_env(template: dict[str, Any], function: str, res: K.Resources) -> dict[str, str]:
    """The environment template.yaml gives a function, for tables named ``res``."""
    names = {t: getattr(res, f) for t, f in K.TABLE_RESOURCES.items()}
    names[K.BUCKET_RESOURCE] = res.bucket
    params = {n: str(p["Default"]) for n, p in template["Parameters"].items()}
    fn = template["Resources"][function]["Properties"]
    raw = {
        **template["Globals"]["Function"]["Environment"]["Variables"],
        **fn.get("Environment", {}).get("Variables", {}),
    }

    def value(v: Any) -> str:
        return names.get(v["Ref"]) or params[v["Ref"]] if isinstance(v, dict) else str(v)

    return {k: value(v) for k, v in raw.items()}


@dataclass
class Stack:
    resources: K.Resources
    dynamodb: Any
    s3: Any
    faults: Faults
    token: str
    planes: list[Plane] = field(default_factory=list)

    def call(
        self, method: str, path: str, body: Any = None, **kw: Any
    ) -> tuple[int, Any, dict[str, str]]:
        """One request through the Lambda entry point, as API Gateway sends it."""
        data = b"" if body is None else msgpack.packb(body, use_bin_type=True)
        headers = {"content-type": MP, "authorization": f"Bearer {self.token}"}
        event = apigw.http_event(method, path, headers=headers, body=data, **kw)
        status, hdrs, raw = apigw.http_response(api_handler.handler(event, None))
        parsed = msgpack.unpackb(raw) if raw and status != 204 else None
        return status, parsed, {k.lower(): v for k, v in hdrs}

    def plane(self, clock: FakeClock | None = None) -> Plane:
        """Another plane on the same tables (another process), with moto's own clients."""
        store = DynamoStore(self.resources, dynamodb=self.dynamodb, s3=self.s3)
        self.planes.append(Plane(store, clock=clock))
        return self.planes[-1]

    def records(self, queue: str) -> dict[str, Any]:
        return {r.id: r for r in self.plane().store.list_invocations(queue, None, 2e9, None, 100)}


@pytest.fixture
def stack(template: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """moto tables from the template, the API function's environment, an admin token."""
    with moto_stack(REGION) as (resources, dynamodb, s3):
        for key, value in function_env(template, "ApiFunction", resources).items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("LAKESHORE_PLANE", raising=False)
        faults = Faults()
        session = boto3.Session(region_name=REGION)
        faults.install(session, monkeypatch)
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", session)  # what make_clients uses
        monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, ctx: 0.0)
        built = Stack(resources, dynamodb, s3, faults, token="")
        token = bootstrap_admin(built.plane())
        assert token is not None
        built.token = token
        yield built
        for plane in built.planes:
            plane.close()
    api_handler._lambda_app = None
    sweeper._plane = None


def submission(inv_id: str, queue: str = "jobs", x: int = 16) -> dict[str, Any]:
    return {"id": inv_id, "queue": queue, "ref": "math:sqrt", "args": [x]}


def result_of(value: Any) -> bytes:
    envelope, blobs = encode_result(value, prefer_msgpack=True)
    assert not blobs
    return envelope


def test_a_job_end_to_end_through_the_lambda_handler(
    stack: Stack, template: dict[str, Any]
) -> None:
    # Given the API function's environment from the template (tables, max_wait)
    status, hello, _ = stack.call("GET", "/v1/hello")
    assert status == 200 and hello["identity"]["role"] == "admin"
    assert hello["limits"]["max_wait"] == float(template["Parameters"]["MaxWaitSeconds"]["Default"])
    # When a producer submits, a worker claims, logs, completes, and the producer reads
    status, body, _ = stack.call("POST", "/v1/invocations", {"invocations": [submission("e2e-1")]})
    assert status == 200 and body["ids"] == ["e2e-1"]
    status, body, _ = stack.call("POST", "/v1/claims", {"queues": ["jobs"], "worker": "w1"})
    [claim] = body["claims"]
    assert claim["id"] == "e2e-1"
    lease = {"id": "e2e-1", "lease_token": claim["lease_token"]}
    status, _, _ = stack.call("POST", "/v1/logs", {**lease, "chunks": [[1, "stdout", "hi\n"]]})
    assert status == 200
    done = {"results": [{**lease, "result": result_of(4.0)}]}
    status, body, _ = stack.call("POST", "/v1/completions", done)
    assert body["answers"] == [{"id": "e2e-1", "ok": True, "error": None}]
    status, body, _ = stack.call("POST", "/v1/invocations/wait", {"ids": ["e2e-1"], "timeout": 1})
    [view] = body["invocations"]
    assert (view["state"], view["value"], view["worker"]) == ("succeeded", 4.0, "w1")
    status, body, _ = stack.call("GET", "/v1/invocations/e2e-1/logs")
    assert [e["text"] for e in body["entries"]] == ["hi\n"]
    # And blobs, listings and deletion work under the same policy
    data = b"blob bytes"
    digest = hashlib.sha256(data).hexdigest()
    status, body, _ = stack.call("POST", "/v1/blobs/missing", {"digests": [digest]})
    assert body["missing"] == [digest] and body["upload"][digest].startswith("https://")
    event_kw = {"headers": {"authorization": f"Bearer {stack.token}"}, "body": data}
    answer = api_handler.handler(apigw.http_event("PUT", f"/v1/blobs/{digest}", **event_kw), None)
    assert answer["statusCode"] == 204
    status, body, _ = stack.call("GET", "/v1/queues")
    assert [q["name"] for q in body["queues"]] == ["jobs"]
    status, body, _ = stack.call("DELETE", "/v1/queues/jobs", query_string="force=true")
    assert status == 200 and body["deleted"] == 1
    # Then every call the store made is allowed by the functions' policy
    assert_allowed(stack.faults.calls, template, stack.resources)


def test_the_sweeper_hands_an_expired_lease_back(
    stack: Stack, template: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an invocation claimed long ago whose worker is gone
    old = stack.plane(FakeClock(T0))
    old.ensure_queue(QueueSpec("jobs"))
    old.submit(
        [
            Submission(
                id="lost-1", queue="jobs", payload=encode_ref_call("math:sqrt", (4,), {}).payload
            )
        ]
    )
    assert old.claim(["jobs"], "gone")
    for key, value in function_env(template, "SweeperFunction", stack.resources).items():
        monkeypatch.setenv(key, value)
    # When the schedule fires the sweeper (twice)
    event = {"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}
    assert sweeper.handler(event, None) == {"expired_leases": 1}
    assert sweeper.handler(event, None) == {"expired_leases": 0}
    # Then it is pending again, its lease gone, its attempt kept
    rec = stack.records("jobs")["lost-1"]
    assert (rec.state, rec.lease_token, rec.attempt) == (State.PENDING, None, 1)
    assert_allowed(stack.faults.calls, template, stack.resources)


def test_the_sweeper_counts_an_attempt_it_fails_past_its_timeout(
    stack: Stack,
    template: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a call with a 1 s timeout claimed long ago (its worker silent since)
    old = stack.plane(FakeClock(T0))
    old.ensure_queue(QueueSpec("slow"))
    payload = encode_ref_call("time:sleep", (600,), {}).payload
    old.submit([Submission(id="late-1", queue="slow", payload=payload, timeout=1.0)])
    assert old.claim(["slow"], "gone")
    for key, value in function_env(template, "SweeperFunction", stack.resources).items():
        monkeypatch.setenv(key, value)
    for name in ("_plane", "_metrics", "_logger", "_registry"):  # (a fresh container)
        monkeypatch.setattr(sweeper, name, None)
    capsys.readouterr()
    # When the schedule fires the sweeper
    event = {"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}
    assert sweeper.handler(event, None) == {"expired_leases": 1}
    # Then the call failed as timed out, and the run wrote it as a Failed metric of its
    # queue (CloudWatch EMF on stdout), as the API counts a worker's failure
    assert stack.records("slow")["late-1"].state is State.FAILED
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "_aws" in line]
    failed = [d for d in docs if d.get("queue") == "slow" and "Failed" in d]
    assert [d["Failed"] for d in failed] == [[1.0]]


def test_a_batch_through_the_api_is_one_group_written_once_a_step(stack: Stack) -> None:
    # Given ten submissions without ids in one request
    subs = [{"queue": "jobs", "ref": "math:sqrt", "args": [n]} for n in range(10)]
    puts = ("dynamodb", "PutItem", stack.resources.invocations)
    sent = stack.faults.sent[puts]
    status, body, _ = stack.call("POST", "/v1/invocations", {"invocations": subs})
    # Then the API gave them ids of one group, stored as a payload item and a group item
    assert status == 200 and len({i.rsplit(".", 1)[0] for i in body["ids"]}) == 1
    assert stack.faults.sent[puts] - sent == 2
    # When a worker claims and completes all ten, each step writes the group once (and
    # the completion its result item)
    sent = stack.faults.sent[puts]
    _, claimed, _ = stack.call(
        "POST", "/v1/claims", {"queues": ["jobs"], "worker": "w", "limit": 10}
    )
    assert len(claimed["claims"]) == 10 and stack.faults.sent[puts] - sent == 1
    results = [
        {"id": c["id"], "lease_token": c["lease_token"], "result": result_of(n)}
        for n, c in enumerate(claimed["claims"])
    ]
    sent = stack.faults.sent[puts]
    _, done, _ = stack.call("POST", "/v1/completions", {"results": results})
    assert all(a["ok"] for a in done["answers"]) and stack.faults.sent[puts] - sent == 2
    # And an id of that group submitted to another queue is refused with a reason
    assert stack.call("POST", "/v1/queues", {"name": "other"})[0] in (200, 201)
    base = body["ids"][0].rsplit(".", 1)[0]
    status, refused, _ = stack.call(
        "POST", "/v1/invocations", {"invocations": [submission(base + ".f", "other")]}
    )
    assert status == 400 and "one queue" in refused["error"]["message"]


def test_a_submit_carrying_its_blobs_through_the_lambda_stores_them_in_s3(
    stack: Stack, template: dict[str, Any]
) -> None:
    # Given a pickled call whose arguments travel as a blob, with its function body
    call = encode_pickle_call(math.floor, (b"x" * 5000,), {}, inline_limit=1024)
    [args_ref] = [d for d in call.blobs if d != decode_payload(call.payload)["fn"]]
    item = {"id": "carried-1", "queue": "jobs", "payload": call.payload}
    listed = {"Bucket": stack.resources.bucket, "Prefix": K.BLOB_PREFIX}
    # When a submit carries one blob whose bytes are not its digest's: a 400, nothing kept
    wrong = {**call.blobs, args_ref: b"other bytes"}
    status, body, _ = stack.call("POST", "/v1/invocations", {"invocations": [item], "blobs": wrong})
    assert status == 400 and args_ref[:12] in body["error"]["message"]
    assert stack.s3.list_objects_v2(**listed).get("KeyCount", 0) == 0
    assert stack.records("jobs") == {}
    # When the submit carries the blobs as they are (base64 in the API Gateway event)
    blobs = call.blobs
    status, body, _ = stack.call("POST", "/v1/invocations", {"invocations": [item], "blobs": blobs})
    # Then the blobs are in the bucket, and a worker's claim names the argument blob
    assert (status, body["ids"]) == (200, ["carried-1"])
    keys = {o["Key"] for o in stack.s3.list_objects_v2(**listed)["Contents"]}
    assert keys == {K.blob_key(d) for d in blobs}
    _, claimed, _ = stack.call("POST", "/v1/claims", {"queues": ["jobs"], "worker": "w1"})
    [claim] = claimed["claims"]
    assert decode_payload(claim["payload"])["args_ref"] == args_ref
    assert stack.plane().get_blob(args_ref) == blobs[args_ref]
    assert_allowed(stack.faults.calls, template, stack.resources)


# --- faults --------------------------------------------------------------------------


def _attempts(client: Any) -> int:
    """How many times the handler's botocore sends one request before it gives up: the
    Lambda retry budget (``lambda_client_config``), not the test client's own."""
    from dreamlake.lakeshore.stores.dynamo import lambda_client_config

    assert client is not None
    return int(lambda_client_config().retries["total_max_attempts"])


def test_a_throttled_write_is_retried_and_recorded_once(stack: Stack) -> None:
    # Given DynamoDB throttles the first two attempts of a write to the invocations table
    invocations = ("dynamodb", "PutItem", stack.resources.invocations)
    stack.faults.fail(*invocations[:2], 400, "ThrottlingException", table=invocations[2], times=2)
    # When a submit comes in
    status, body, _ = stack.call("POST", "/v1/invocations", {"invocations": [submission("t-1")]})
    # Then botocore's retries absorbed it: one answer, one record (two refused attempts,
    # then the payload item and the group item)
    assert (status, body["ids"]) == (200, ["t-1"])
    assert stack.faults.sent[invocations] == 4
    assert list(stack.records("jobs")) == ["t-1"]


def test_persistent_throttling_is_a_503_with_retry_after_and_loses_nothing(stack: Stack) -> None:
    # Given DynamoDB keeps refusing writes to the invocations table
    invocations = ("dynamodb", "PutItem", stack.resources.invocations)
    stack.faults.fail(
        *invocations[:2], 400, "ProvisionedThroughputExceededException", table=invocations[2]
    )
    # When a submit comes in
    status, body, headers = stack.call(
        "POST", "/v1/invocations", {"invocations": [submission("t-2")]}
    )
    # Then after botocore's attempts the API answers 503, Retry-After and a one-line reason
    assert status == 503 and headers["retry-after"] == str(aws_handler.RETRY_AFTER)
    assert body["error"]["code"] == "unavailable"
    message = body["error"]["message"]
    assert "ProvisionedThroughputExceededException" in message and "\n" not in message
    assert stack.faults.sent[invocations] == _attempts(stack.dynamodb)
    assert "t-2" not in stack.records("jobs")
    # And the client's retry of the same request, once DynamoDB recovers, records it once
    stack.faults.errors.clear()
    for _ in range(2):
        status, body, _ = stack.call(
            "POST", "/v1/invocations", {"invocations": [submission("t-2")]}
        )
        assert (status, body["ids"]) == (200, ["t-2"])
    assert list(stack.records("jobs")) == ["t-2"]


def test_an_s3_5xx_on_a_blob_put_is_retried_then_a_503(stack: Stack) -> None:
    data = b"x" * 1000
    digest = hashlib.sha256(data).hexdigest()
    kw = {"headers": {"authorization": f"Bearer {stack.token}"}, "body": data}

    def put() -> dict[str, Any]:
        event = apigw.http_event("PUT", f"/v1/blobs/{digest}", **kw)
        answer: dict[str, Any] = api_handler.handler(event, None)
        return answer

    # Given S3 answers 500 to every PutObject
    stack.faults.fail("s3", "PutObject", 500, "InternalError")
    # When the blob is uploaded: 503 with Retry-After, and nothing stored
    answer = put()
    assert answer["statusCode"] == 503 and answer["headers"]["Retry-After"] == "1"
    assert "InternalError" in json.loads(answer["body"])["error"]["message"]
    assert stack.faults.sent[("s3", "PutObject", "")] == _attempts(stack.s3)
    listed = stack.s3.list_objects_v2(Bucket=stack.resources.bucket, Prefix=K.BLOB_PREFIX)
    assert listed.get("KeyCount", 0) == 0
    # When S3 fails only twice more: the retries absorb it and the blob is stored once
    stack.faults.fail("s3", "PutObject", 503, "ServiceUnavailable", times=2)
    assert put()["statusCode"] == 204
    listed = stack.s3.list_objects_v2(Bucket=stack.resources.bucket, Prefix=K.BLOB_PREFIX)
    assert [o["Key"] for o in listed["Contents"]] == [K.blob_key(digest)]


def test_a_lost_answer_to_a_write_is_resent_and_recognised(stack: Stack) -> None:
    # Given the answers to the conditional group writes of a submit and of a completion
    # are lost once (they landed; botocore resends them, and their conditions fail)
    table = stack.resources.invocations
    stack.faults.lose_guarded[("dynamodb", "PutItem", table)] = 1
    status, body, _ = stack.call("POST", "/v1/invocations", {"invocations": [submission("l-1")]})
    assert (status, body["ids"]) == (200, ["l-1"])
    _, body, _ = stack.call("POST", "/v1/claims", {"queues": ["jobs"], "worker": "w1"})
    lease = {"id": "l-1", "lease_token": body["claims"][0]["lease_token"]}
    stack.faults.lose_guarded[("dynamodb", "PutItem", table)] = 1
    _, body, _ = stack.call(
        "POST", "/v1/completions", {"results": [{**lease, "result": result_of(2)}]}
    )
    # Then both answer success and the records show one invocation, succeeded once
    assert body["answers"][0]["ok"] is True
    assert not +stack.faults.lose_guarded
    [rec] = stack.records("jobs").values()
    assert (rec.id, rec.state, rec.attempt) == ("l-1", State.SUCCEEDED, 1)


def test_two_claimers_racing_for_one_invocation_each_get_their_own(stack: Stack) -> None:
    # Given two pending invocations in a FIFO queue
    subs = [submission("r-1"), submission("r-2")]
    assert stack.call("POST", "/v1/invocations", {"invocations": subs})[0] == 200
    rival_claims: list[Any] = []

    def rival_claims_the_head() -> None:
        rival_claims.extend(stack.plane().claim(["jobs"], "rival"))

    # When a rival claims the head between the API's read and its conditional write
    puts = ("dynamodb", "PutItem", stack.resources.invocations)
    stack.faults.before[puts] = rival_claims_the_head
    sent = stack.faults.sent[puts]
    status, body, _ = stack.call("POST", "/v1/claims", {"queues": ["jobs"], "worker": "w1"})
    # Then the API's condition failed on r-1, so it took r-2: no error, no double claim
    assert status == 200
    # (three conditional writes: the rival's, the API's refused one, the API's on r-2)
    assert stack.faults.sent[puts] - sent == 3
    assert [c.id for c in rival_claims] == ["r-1"]
    assert [c["id"] for c in body["claims"]] == ["r-2"]
    recs = stack.records("jobs")
    assert {i: (r.state, r.worker, r.attempt) for i, r in recs.items()} == {
        "r-1": (State.RUNNING, "rival", 1),
        "r-2": (State.RUNNING, "w1", 1),
    }


def test_an_unreachable_table_is_a_503_too(stack: Stack) -> None:
    # Given DynamoDB cannot be reached at all (every attempt fails to connect)
    stack.faults.fail("dynamodb", "GetItem", 0, "", table=stack.resources.invocations)
    # When an invocation is read
    status, body, headers = stack.call("GET", "/v1/invocations/nope")
    # Then after botocore's attempts: 503, Retry-After, and why
    assert status == 503 and headers["retry-after"] == "1"
    assert "cannot reach" in body["error"]["message"]
    key = ("dynamodb", "GetItem", stack.resources.invocations)
    assert stack.faults.sent[key] == _attempts(stack.dynamodb)


def test_the_environment_chooses_the_store_and_max_wait(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAKESHORE_PLANE", "/tmp/plane.db")
    with pytest.raises(RuntimeError, match="not both"):
        api_handler._service_from_env()
    monkeypatch.delenv("LAKESHORE_PLANE")
    monkeypatch.delenv("LAKESHORE_LOGS_TABLE")
    with pytest.raises(RuntimeError, match="LAKESHORE_LOGS_TABLE"):
        api_handler._service_from_env()
    for bad in ("soon", "-1", "600"):
        monkeypatch.setenv(aws_handler.ENV_MAX_WAIT, bad)
        with pytest.raises(RuntimeError, match=aws_handler.ENV_MAX_WAIT):
            aws_handler.limits_from_env()


# --- the build -----------------------------------------------------------------------


def _make(target: str, artifacts: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT), target, f"ARTIFACTS_DIR={artifacts}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_build_lays_out_the_package_as_lambda_imports_it(tmp_path: Path) -> None:
    # Given the code part of the function build
    proc = _make("lambda-code", tmp_path)
    assert proc.returncode == 0, proc.stderr
    pkg = tmp_path / "dreamlake" / "lakeshore"
    assert {p.name for p in tmp_path.iterdir()} == {"dreamlake"}
    assert (pkg / "handlers" / "api.py").is_file() and (pkg / "stores" / "keys.py").is_file()
    assert not (pkg / "cli").exists() and not list(tmp_path.rglob("__pycache__"))
    # When Python imports the handlers from it, with no site (as /var/task + the runtime)
    deps = os.pathsep.join(
        [str(tmp_path), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    )
    code = (
        "import dreamlake.lakeshore.handlers.api as a, dreamlake.lakeshore.handlers.sweeper, "
        "dreamlake.lakeshore.handlers.aws; print(a.__file__)"
    )
    run = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env={**os.environ, "PYTHONPATH": deps},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then they come from the artifact
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(pkg / "handlers" / "api.py")


@pytest.mark.slow
def test_the_function_build_bundles_arm64_dependencies(tmp_path: Path) -> None:
    proc = _make("build-ApiFunction", tmp_path)
    offline = ("NewConnectionError", "Network is unreachable", "Temporary failure in name")
    if proc.returncode and any(s in proc.stderr for s in offline):
        pytest.skip("the package index is unreachable; the offline layout test still ran")
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in tmp_path.iterdir()}
    assert {"dreamlake", "cloudpickle", "msgpack", "aws_lambda_powertools"} <= names
    assert not names & {"boto3", "botocore", "bin"}  # boto3 is in the Lambda runtime
    assert list((tmp_path / "msgpack").glob("*cpython-312-aarch64-linux-gnu.so"))


# --- lakeshore deploy and bootstrap ------------------------------------------------------


def _cli() -> Any:
    import typer

    app = typer.Typer()
    app.command()(deploy)
    app.command()(bootstrap)
    return app


def test_deploy_says_how_to_get_sam_when_it_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = CliRunner().invoke(_cli(), ["deploy"])
    assert result.exit_code == 2
    assert "needs the AWS SAM CLI" in result.output


def test_deploy_builds_then_deploys_with_sam(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a sam on PATH that records its arguments, and a checkout
    log = tmp_path / "sam.log"
    sam = tmp_path / "bin" / "sam"
    sam.parent.mkdir()
    sam.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    sam.chmod(0o755)
    monkeypatch.setenv("PATH", f"{sam.parent}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "template.yaml").write_text(TEMPLATE.read_text())
    monkeypatch.chdir(tmp_path)
    # When deploy runs
    result = CliRunner().invoke(_cli(), ["deploy", "--stack-name", "lk-test"])
    # Then it built in source, deployed the stack, and pointed at bootstrap
    assert result.exit_code == 0, result.output
    build, ship = log.read_text().splitlines()
    assert build == "build --template-file template.yaml --build-in-source"
    assert ship.startswith("deploy --stack-name lk-test --capabilities CAPABILITY_IAM")
    assert "lakeshore bootstrap --stack-name lk-test" in result.output


def test_bootstrap_mints_the_first_admin_token_once(stack: Stack) -> None:
    # Given a deployed stack (moto CloudFormation) whose outputs name the plane's tables,
    # and a plane without tokens
    from dreamlake.lakeshore.cli.deploy import API_URL_OUTPUT, STACK_OUTPUTS

    plane = stack.plane()
    for held in plane.store.list_tokens():  # the fixture's token: start from none
        key = {K.REC_KIND: {"S": K.REC_TOKEN}, K.REC_ID: {"S": held.id}}
        stack.dynamodb.delete_item(TableName=stack.resources.records, Key=key)
    outputs = {k: {"Value": getattr(stack.resources, f)} for k, f in STACK_OUTPUTS.items()}
    outputs[API_URL_OUTPUT] = {"Value": "https://abc.execute-api.us-east-1.amazonaws.com"}
    body = {"Resources": {"Q": {"Type": "AWS::SQS::Queue"}}, "Outputs": outputs}
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName="lk", TemplateBody=json.dumps(body)
    )
    app = _cli()
    # When bootstrap runs: the URL and an admin token of that plane, printed once
    first = CliRunner().invoke(app, ["bootstrap", "--stack-name", "lk", "--region", REGION])
    assert first.exit_code == 0, first.output
    token = re.search(r"admin token: (\S+)", first.output)
    assert token is not None and "https://abc.execute-api" in first.output
    assert authenticate(plane, f"Bearer {token.group(1)}").role == "admin"
    # Then a second run refuses, unless asked for another token
    again = CliRunner().invoke(app, ["bootstrap", "--stack-name", "lk", "--region", REGION])
    assert again.exit_code == 1 and "--force-new" in again.output
    forced = ["bootstrap", "--stack-name", "lk", "--region", REGION, "--force-new"]
    assert CliRunner().invoke(app, forced).exit_code == 0
    assert len(plane.store.list_tokens()) == 2
    # And an unknown stack is a clear message
    missing = CliRunner().invoke(app, ["bootstrap", "--stack-name", "nope", "--region", REGION])
    assert missing.exit_code == 1 and "no stack nope" in missing.output
