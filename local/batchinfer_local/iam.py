"""IAM in the local stack: each function's execution role exactly as SAM makes it, and the identities.

Roles come from the SAM translator itself (`samtranslator.translator.translator.Translator`, what
`sam build`/`sam deploy` run): every `AWS::Serverless::Function` becomes an `AWS::IAM::Role` whose
- `Policies` are the function's `Policies`, policy templates expanded (SAM's
  `PolicyTemplatesProcessor`), inline `Statement`s and `Fn::If` items kept;
- `ManagedPolicyArns` are `AWSLambdaBasicExecutionRole`, `AWSXrayWriteOnlyAccess` with `Tracing: Active`,
  and `AWSLambdaSQSQueueExecutionRole` for an SQS event (samtranslator/model/eventsources/pull.py);
- trust policy names `lambda.amazonaws.com`.
The translator leaves intrinsics (`Fn::Sub`, `Ref`, `Fn::GetAtt`, `Fn::If`) in place: `RoleSpec.resolve`
evaluates them with the local stack's `Resolver` once the resources exist. No library turns a SAM
template into live moto roles, hence this module; moto does the rest (users, roles, STS, evaluation).

Identities (moto/core/authorization.py `ActionAuthenticatorMixin`): after `/moto-api/reset-auth N`
moto lets exactly N requests through unauthenticated. `bootstrap_admin` spends three of them on the
stack's admin user (CreateUser, PutUserPolicy `*:*`, CreateAccessKey); from then on every request is
authenticated. The admin's key is renamed to the well-known `testing`/`testing` (moto's and the old
local stack's default credentials), so operators' tools keep working against the local stack, while
any other unknown key is refused as on AWS. Each function gets its role's `AssumeRole` credentials.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from dataclasses import dataclass
from typing import Any

import boto3
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator

from .template import LOCAL_ACCOUNT_ID, LOCAL_REGION, SERVERLESS_FUNCTION, Resolver, TemplateError

ADMIN_USER = "batchinfer-local-admin"
# The admin's access key id and secret (see the module docstring).
ADMIN_KEY = "testing"
# moto requests the admin's creation takes: CreateUser, PutUserPolicy, CreateAccessKey.
_BOOTSTRAP_REQUESTS = 3
# Placeholders the translator validates (CodeUri, ImageUri, Runtime, Handler shapes); none reach a role.
_CODE_URI = "s3://batchinfer-local-code/{}"
_IMAGE_URI = "{account}.dkr.ecr.{region}.amazonaws.com/batchinfer-local:{name}"
# Twelve hours: STS's maximum (moto does not expire credentials; Lambda would refresh them).
_SESSION_SECONDS = 43_200


@dataclass(frozen=True)
class Credentials:
    """An AWS access key (with a session token for assumed roles)."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def environ(self) -> dict[str, str]:
        """The variables Lambda sets for its function's role (AWS_ACCESS_KEY_ID, ...)."""
        values = {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
        if self.session_token:
            values["AWS_SESSION_TOKEN"] = self.session_token
        return values

    def client(self, session: boto3.session.Session, service: str, **options: Any) -> Any:
        """A client of `session` for `service` with these credentials (one session loads the service
        models once for all credentials; create clients in one thread at a time: sessions are not
        thread-safe, clients are)."""
        return session.client(
            service,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            aws_session_token=self.session_token,
            **options,
        )


ADMIN = Credentials(ADMIN_KEY, ADMIN_KEY)


@dataclass(frozen=True)
class RoleSpec:
    """One function's role as SAM generates it; `policies` are its `Policies` items
    (`{"PolicyName", "PolicyDocument"}`, or an `Fn::If` choosing one until `resolve`)."""

    function: str
    role_logical_id: str
    managed_policy_arns: tuple[str, ...]
    policies: tuple[Any, ...]

    def resolve(self, resolver: Resolver) -> RoleSpec:
        """The role with every intrinsic evaluated (a policy an `Fn::If` removes is left out).

        Raises:
            TemplateError: an expression cannot be resolved locally.
        """
        policies = resolver.resolve(list(self.policies), f"{self.role_logical_id}.Policies")
        arns = resolver.resolve(list(self.managed_policy_arns), f"{self.role_logical_id}.ManagedPolicyArns")
        return RoleSpec(self.function, self.role_logical_id, tuple(str(arn) for arn in arns), tuple(policies))

    @property
    def inline_policies(self) -> dict[str, dict[str, Any]]:
        """PolicyDocument by PolicyName (of a resolved role)."""
        return {policy["PolicyName"]: policy["PolicyDocument"] for policy in self.policies}

    def statements(self) -> list[dict[str, Any]]:
        """Every statement of the inline policies, in order (of a resolved role)."""
        return [
            statement for document in self.inline_policies.values() for statement in document["Statement"]
        ]


def sam_roles(
    template: dict[str, Any], parameter_values: dict[str, Any] | None = None
) -> dict[str, RoleSpec]:
    """Run the SAM translator on `template`; each function's execution role by function logical id.

    Raises:
        TemplateError: the translator rejects the template, or a function's `Role` is not a role of
            the template (an existing role's ARN cannot be emulated).
    """
    sam = copy.deepcopy(template)
    for logical_id, resource in sam["Resources"].items():
        properties = resource.setdefault("Properties", {})
        if resource.get("Type") == SERVERLESS_FUNCTION:
            if properties.get("PackageType") == "Image":
                properties["ImageUri"] = _IMAGE_URI.format(
                    account=LOCAL_ACCOUNT_ID, region=LOCAL_REGION, name=logical_id
                )
            else:
                properties["CodeUri"] = _CODE_URI.format(logical_id)
                properties.setdefault("Handler", "app.handler")
                if "Runtime" not in ((sam.get("Globals") or {}).get("Function") or {}):
                    properties.setdefault("Runtime", "python3.12")
        elif resource.get("Type") == "AWS::Serverless::LayerVersion":
            properties["ContentUri"] = _CODE_URI.format(logical_id)
    values = {
        "AWS::Region": LOCAL_REGION,
        "AWS::AccountId": LOCAL_ACCOUNT_ID,
        "AWS::Partition": "aws",
        **(parameter_values or {}),
    }
    translator = Translator(None, Parser(), boto_session=boto3.session.Session(region_name=LOCAL_REGION))
    try:
        # The managed-policy map is only consulted for Policies named by a bare managed policy name.
        output = translator.translate(sam, parameter_values=values, get_managed_policy_map=dict)
    except Exception as exc:  # samtranslator raises its own exception types
        raise TemplateError(f"the SAM translator rejects the template: {exc}") from exc
    roles: dict[str, RoleSpec] = {}
    for logical_id, resource in output["Resources"].items():
        if resource["Type"] != "AWS::Lambda::Function":
            continue
        role = resource["Properties"].get("Role")
        role_id = role.get("Fn::GetAtt", [None])[0] if isinstance(role, dict) else None
        declared = output["Resources"].get(role_id or "", {})
        if declared.get("Type") != "AWS::IAM::Role":
            raise TemplateError(
                f"{logical_id}: Role {role!r} is not a role of the template (not emulated locally)"
            )
        properties = declared["Properties"]
        roles[logical_id] = RoleSpec(
            function=logical_id,
            role_logical_id=role_id,
            managed_policy_arns=tuple(properties.get("ManagedPolicyArns") or ()),
            policies=tuple(properties.get("Policies") or ()),
        )
    return roles


def _moto_api(endpoint: str, path: str, body: str = "") -> None:
    # text/plain: with a form content type werkzeug swallows the body and moto answers 500.
    request = urllib.request.Request(
        f"{endpoint}{path}", data=body.encode(), method="POST", headers={"Content-Type": "text/plain"}
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


def bootstrap_admin(endpoint: str, clients: Any) -> Credentials:
    """Create the stack's admin user in moto's unauthenticated window, then enforce IAM; its credentials.

    `clients(credentials, service)` makes a boto3 client for moto. The admin may do everything
    (`Action: *`, `Resource: *`); it is what the stack itself, tests and operators use.
    """
    from moto.iam.models import iam_backends

    _moto_api(endpoint, "/moto-api/reset-auth", str(_BOOTSTRAP_REQUESTS))
    iam = clients(Credentials("bootstrap", "bootstrap"), "iam")  # not checked during the window
    iam.create_user(UserName=ADMIN_USER)
    iam.put_user_policy(
        UserName=ADMIN_USER,
        PolicyName="admin",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        ),
    )
    created = iam.create_access_key(UserName=ADMIN_USER)["AccessKey"]["AccessKeyId"]
    # Give the key its well-known id and secret (moto generates random ones; ThreadedMotoServer's
    # backends live in this process).
    backend = iam_backends[LOCAL_ACCOUNT_ID]["aws"]
    key = backend.access_keys.pop(created)
    key.access_key_id = key.secret_access_key = ADMIN_KEY
    backend.access_keys[ADMIN_KEY] = key
    return ADMIN


def set_enforcement(endpoint: str, enforced: bool) -> None:
    """Turn moto's request authentication and authorization on or off (on a running server)."""
    _moto_api(endpoint, "/moto-api/reset-auth", "0" if enforced else "inf")


def create_role(role: RoleSpec, stack_name: str, session_name: str, clients: Any) -> Credentials:
    """Create `role` (resolved) in moto as `<stack>-<RoleLogicalId>`, assume it as `session_name` (Lambda:
    the function name); the session's credentials.

    `clients(service)` makes an admin boto3 client. SAM's trust policy names lambda.amazonaws.com,
    which cannot assume anything locally (and moto can only evaluate `Principal.AWS`): locally the role
    trusts the stack's admin, which assumes it on the function's behalf. Its permission policies are
    SAM's, unchanged but for `Version: 2012-10-17`, which SAM's policy templates leave out (AWS then
    means 2008-10-17, which differs only in policy variables, unused here) and moto requires.
    """
    iam, sts = clients("iam"), clients("sts")
    name = f"{stack_name}-{role.role_logical_id}"
    admin_arn = f"arn:aws:iam::{LOCAL_ACCOUNT_ID}:user/{ADMIN_USER}"
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": admin_arn}, "Action": "sts:AssumeRole"}],
    }
    arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    for policy_name, document in role.inline_policies.items():
        iam.put_role_policy(
            RoleName=name,
            PolicyName=policy_name,
            PolicyDocument=json.dumps({"Version": "2012-10-17", **document}),
        )
    for policy_arn in role.managed_policy_arns:
        iam.attach_role_policy(RoleName=name, PolicyArn=policy_arn)
    assumed = sts.assume_role(
        RoleArn=arn, RoleSessionName=session_name[:64], DurationSeconds=_SESSION_SECONDS
    )["Credentials"]
    return Credentials(assumed["AccessKeyId"], assumed["SecretAccessKey"], assumed["SessionToken"])
