"""``lakeshore deploy`` and ``lakeshore bootstrap``: a plane on AWS (template.yaml).

``deploy`` runs ``sam build`` and ``sam deploy`` in a checkout: template.yaml is the
stack, the Makefile builds its functions. ``bootstrap`` mints the deployed plane's first
admin token straight into its records table with the caller's own AWS credentials. Write
access to that table is the proof of ownership, so the API has no bootstrap route that
anyone on the internet could call first.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Annotated, Any

import typer

from .common import fail

__all__ = [
    "API_URL_OUTPUT",
    "STACK_OUTPUTS",
    "NotAPlaneStack",
    "TokensExist",
    "bootstrap",
    "deploy",
    "mint_admin_token",
    "stack_outputs",
]

#: stack output → the :class:`~dreamlake.lakeshore.stores.keys.Resources` field it names
STACK_OUTPUTS = {
    "QueuesTableName": "queues",
    "InvocationGroupsTableName": "invocations",
    "RecordsTableName": "records",
    "LogsTableName": "logs",
    "BlobBucketName": "bucket",
}
#: stack output holding the plane's URL (LAKESHORE_URL)
API_URL_OUTPUT = "ApiUrl"

_SAM_INSTALL = (
    "https://docs.aws.amazon.com/serverless-application-model/latest/developerguide/"
    "install-sam-cli.html"
)

RegionOpt = Annotated[
    str | None, typer.Option(help="The stack's AWS region (else your AWS configuration's).")
]


class TokensExist(Exception):
    """The plane has tokens already: bootstrap refuses without ``force_new``."""


class NotAPlaneStack(Exception):
    """The stack lacks outputs a Lakeshore stack has (the message names them)."""


def deploy(
    stack_name: Annotated[
        str, typer.Option(help="The CloudFormation stack to create or update.")
    ] = ("lakeshore"),
    guided: Annotated[
        bool,
        typer.Option("--guided", help="Let sam ask for each setting (saved to samconfig.toml)."),
    ] = False,
    region: RegionOpt = None,
    template: Annotated[
        Path, typer.Option(help="The stack's template, in a Lakeshore checkout.")
    ] = Path("template.yaml"),
) -> None:
    """Build and deploy the plane's stack with the AWS SAM CLI (sam build, sam deploy)."""
    sam = shutil.which("sam")
    if sam is None:
        raise fail(
            "lakeshore deploy needs the AWS SAM CLI (`sam`) on PATH: "
            f"pip install aws-sam-cli, or see {_SAM_INSTALL}",
            2,
        )
    if not template.is_file():
        raise fail(
            f"no {template}: run lakeshore deploy in a Lakeshore checkout "
            "(it builds the functions from template.yaml and the Makefile)",
            2,
        )
    where = ["--region", region] if region else []
    # Build in place: the Makefile copies only the package into the artifact, so there
    # is no need for sam to copy the whole checkout (and its virtualenv) first.
    build = [sam, "build", "--template-file", template.name, "--build-in-source", *where]
    ship = [sam, "deploy", "--stack-name", stack_name, *where]
    if guided:
        ship.append("--guided")
    else:
        ship += ["--capabilities", "CAPABILITY_IAM", "--resolve-s3"]
        ship.append("--no-fail-on-empty-changeset")
    for cmd in (build, ship):
        typer.echo(f"$ {shlex.join(cmd)}")
        code = subprocess.call(cmd, cwd=template.parent)
        if code:
            raise fail(f"sam {cmd[1]} failed (exit {code})", code)
    again = f" --region {region}" if region else ""
    typer.echo(f"deployed. Next: lakeshore bootstrap --stack-name {stack_name}{again}")


def stack_outputs(cloudformation: Any, stack_name: str) -> dict[str, str]:
    """A stack's outputs by key (CloudFormation DescribeStacks)."""
    stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def mint_admin_token(
    stack_name: str, *, region: str | None = None, force_new: bool = False, session: Any = None
) -> tuple[str, str]:
    """Mint an admin token in a deployed plane's records table; return (URL, token).

    Reads the table names and the URL from the stack's outputs. Raises
    :class:`TokensExist` if the plane has tokens and ``force_new`` is false,
    :class:`NotAPlaneStack` naming the outputs the stack lacks, and botocore's errors as
    they come.
    """
    import boto3  # type: ignore[import-untyped]

    from ..api.auth import create_token
    from ..plane import Plane
    from ..stores.dynamo import DynamoStore, make_clients
    from ..stores.keys import Resources

    session = session or boto3.Session(region_name=region)
    outputs = stack_outputs(session.client("cloudformation"), stack_name)
    missing = [k for k in (API_URL_OUTPUT, *STACK_OUTPUTS) if k not in outputs]
    if missing:
        raise NotAPlaneStack(", ".join(missing))
    names = {field: outputs[key] for key, field in STACK_OUTPUTS.items()}
    dynamodb, s3 = make_clients(session=session)
    plane = Plane(DynamoStore(Resources(**names), dynamodb=dynamodb, s3=s3))
    try:
        held = plane.store.list_tokens()
        if held and not force_new:
            raise TokensExist(f"{len(held)} token(s)")
        token, _ = create_token(plane, "admin", name="bootstrap")
    finally:
        plane.close()
        dynamodb.close()
        s3.close()
    return outputs[API_URL_OUTPUT], token


def bootstrap(
    stack_name: Annotated[str, typer.Option(help="The deployed stack (see lakeshore deploy).")],
    region: RegionOpt = None,
    force_new: Annotated[
        bool,
        typer.Option("--force-new", help="Mint another admin token although the plane has some."),
    ] = False,
) -> None:
    """Mint a deployed plane's first admin token with your AWS credentials; print it once."""
    try:
        from botocore.exceptions import (  # type: ignore[import-untyped]
            ClientError,
            NoCredentialsError,
            NoRegionError,
        )
    except ImportError:
        raise fail(
            "bootstrap needs the aws extra: pip install 'dreamlake-lakeshore[aws]'", 2
        ) from None
    try:
        url, token = mint_admin_token(stack_name, region=region, force_new=force_new)
    except TokensExist as exc:
        raise fail(
            f"the plane of stack {stack_name} has {exc} already: ask one of its admins for a "
            "token (lakeshore tokens create), or mint another admin token with --force-new"
        ) from None
    except NotAPlaneStack as exc:
        raise fail(
            f"stack {stack_name} has no output {exc}: is it a Lakeshore stack "
            "(template.yaml) that finished deploying?"
        ) from None
    except NoRegionError:
        raise fail("no AWS region: give --region or set AWS_REGION", 2) from None
    except NoCredentialsError:
        raise fail(
            "no AWS credentials: bootstrap writes to the stack's records table as you "
            "(aws configure, AWS_PROFILE or AWS_ACCESS_KEY_ID)",
            2,
        ) from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ValidationError":  # DescribeStacks of a stack that does not exist
            raise fail(f"no stack {stack_name} here (region {region or 'default'})") from None
        raise fail(
            f"AWS refused {exc.operation_name} ({code}): bootstrap needs "
            "cloudformation:DescribeStacks on the stack and read/write access to its "
            "records table"
        ) from None
    typer.echo(f"Lakeshore plane of stack {stack_name}")
    typer.echo(f"url:         {url}")
    typer.echo(f"admin token: {token}")
    typer.echo("  shown only now: the plane keeps only its hash. Keep it safe.")
    typer.echo(f"next: lakeshore login --url {url} --token {token}")
