"""Close the gaps between moto 5.2.5's IAM evaluation and AWS's, for the calls batchinfer's functions make.

moto evaluates a request (moto/core/authorization.py
`ActionAuthenticatorMixin._authenticate_and_authorize_action`)
as ONE action `<service>:<Operation>` on ONE resource: whatever the service's response class returns from
`_determine_resource()` (moto/core/responses.py `BaseResponse.call_action`), `"*"` when it has none. So:

- DynamoDB (moto/dynamodb/responses.py `DynamoHandler`) has no `_determine_resource`: every call is checked
  on `"*"`, which a policy on the table's ARN (every SAM DynamoDB* policy template) never matches, so
  GetItem, PutItem, Query ... are all denied. `TransactWriteItems` is checked as itself, which no SAM template
  grants; AWS checks each item's own action (PutItem/UpdateItem/DeleteItem/ConditionCheckItem) on its table,
  and BatchWriteItem/BatchGetItem on each table of `RequestItems`.
- SQS (moto/sqs/responses.py `SQSResponse._determine_resource`) gives the queue's ARN, as AWS does, but checks
  `sqs:DeleteMessageBatch` / `sqs:ChangeMessageVisibilityBatch` / `sqs:SendMessageBatch`, which are no IAM
  actions: AWS authorizes them as DeleteMessage / ChangeMessageVisibility / SendMessage.
- EventBridge (moto/events/responses.py `EventsHandler`) has none either: PutEvents is checked on `"*"`,
  which a policy on the bus's ARN (SAM's EventBridgePutEventsPolicy) never matches; AWS checks each
  entry's bus.
- Secrets Manager has no `_determine_resource` either: a statement on `secret:batchinfer/cos-??????`
  never matches.
- Wildcards (moto/iam/access_control.py `IAMPolicyStatement._match`): only `*` is one; the rest of a
  pattern is
  used as a raw regex, so `?` (IAM: any one character) is a quantifier and `cos-??????` raises `re.error`
  (HTTP 500), and `.` matches any character. Actions match case-sensitively (IAM: case-insensitively).
- S3 HeadBucket (moto/s3/responses.py `ACTION_MAP["BUCKET"]["HEAD"]`) is checked as `s3:HeadBucket`, no IAM
  action; AWS requires `s3:ListBucket`.
- Presigned S3 URLs: every IAMRequest is built from the Authorization header, so a URL signed in its query
  string fails with `KeyError: 'HTTP_AUTHORIZATION'` (HTTP 500).
- ExpectedBucketOwner (`x-amz-expected-bucket-owner`) is ignored; S3 refuses a bucket of another
  account with 403 AccessDenied.
- Errors: moto renders an IAM denial as XML with HTTP 403 for every service; the JSON-protocol services
  answer e.g. DynamoDB's `AccessDeniedException` with HTTP 400, which is what botocore and handlers expect.

`install()` patches these in this process (ThreadedMotoServer runs here, as `moto_atomic` relies on too),
reusing moto's own IAMRequest (signature check, access key -> user or assumed role -> its policies) and its
policy evaluation for each (action, resource) pair; `uninstall()` restores moto. No library fixes moto's IAM
emulation, hence this module.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any
from urllib.parse import parse_qs, urlparse

from botocore.auth import HmacV1Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from moto.core.authorization import ActionAuthenticatorMixin
from moto.core.exceptions import JsonRESTError
from moto.dynamodb.responses import DynamoHandler
from moto.events.responses import EventsHandler
from moto.iam.access_control import (
    CreateAccessKeyFailure,
    IAMPolicyStatement,
    IAMRequest,
    S3IAMRequest,
    create_access_key,
)
from moto.s3 import responses as s3_responses
from moto.s3.exceptions import S3ClientError
from moto.secretsmanager.responses import SecretsManagerResponse
from moto.sqs.responses import SQSResponse
from moto.utilities.utils import get_partition

_ITEM_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
    "Get": "GetItem",
}
_SQS_BATCH = {
    "DeleteMessageBatch": "DeleteMessage",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
    "SendMessageBatch": "SendMessage",
}


# What AWS's JSON-protocol services answer (moto renders its IAM errors as XML with HTTP 403 for every
# service, so botocore reports the JSON services' error code as "403").
_JSON_ERRORS = {
    # service: (denied type, denied status, unknown-key type, bad-signature type, status of those two)
    "dynamodb": (
        "AccessDeniedException",
        400,
        "UnrecognizedClientException",
        "InvalidSignatureException",
        400,
    ),
    "secretsmanager": (
        "AccessDeniedException",
        400,
        "UnrecognizedClientException",
        "InvalidSignatureException",
        400,
    ),
    "sqs": ("AccessDenied", 403, "InvalidClientTokenId", "SignatureDoesNotMatch", 403),
}


class _AwsJsonError(JsonRESTError):
    """An error of a JSON-protocol service as AWS sends it: `__type`, message and HTTP status."""

    def __init__(self, error_type: str, message: str, status: int) -> None:
        self.code = status
        super().__init__(error_type, message)
        # SQS's JSON protocol is "awsQueryCompatible": botocore takes the code from this header.
        self.description = json.dumps(
            {"__type": f"com.amazon.coral.service#{error_type}", "message": message}
        )


class PerActionIAMRequest(IAMRequest):
    """moto's IAMRequest, checking a list of (action, resource) pairs; all must be allowed.

    Errors of JSON-protocol services are JSON, with the codes AWS uses (e.g. DynamoDB's
    AccessDeniedException, HTTP 400), not moto's XML 403.
    """

    def _json(self) -> tuple[str, int, str, str, int] | None:
        return _JSON_ERRORS.get(self._service)

    def _raise_access_denied(self) -> None:
        spec = self._json()
        if spec is None:
            super()._raise_access_denied()
        message = (
            f"User: {self._access_key.arn} is not authorized to perform: {self._action}"
            f" on resource: {self._resource}"
        )
        raise _AwsJsonError(spec[0], message, spec[1])

    def _raise_invalid_access_key(self, reason: str) -> None:
        spec = self._json()
        if spec is None:
            super()._raise_invalid_access_key(reason)
        raise _AwsJsonError(spec[2], "The security token included in the request is invalid.", spec[4])

    def _raise_signature_does_not_match(self) -> None:
        spec = self._json()
        if spec is None:
            super()._raise_signature_does_not_match()
        raise _AwsJsonError(
            spec[3], "The request signature we calculated does not match the signature you provided.", spec[4]
        )

    def check_action_permitted(self, resource: Any) -> None:  # type: ignore[override]
        checks = resource if isinstance(resource, list) else [(self._action, resource)]
        for action, arn in checks:
            self._action, self._resource = action, arn  # also what the AccessDenied message names
            super().check_action_permitted(arn)


def dynamodb_checks(operation: str, body: dict[str, Any], region: str, account: str) -> list[tuple[str, str]]:
    """The (IAM action, resource ARN) pairs AWS authorizes for one DynamoDB API call."""

    def arn(table: str) -> str:
        return table if table.startswith("arn:") else f"arn:aws:dynamodb:{region}:{account}:table/{table}"

    if operation == "TransactWriteItems" or operation == "TransactGetItems":
        checks = []
        for item in body.get("TransactItems") or []:
            kind, spec = next(iter(item.items()))
            checks.append((f"dynamodb:{_ITEM_ACTIONS[kind]}", arn(spec["TableName"])))
        return checks
    if operation in ("BatchWriteItem", "BatchGetItem"):
        return [(f"dynamodb:{operation}", arn(table)) for table in body.get("RequestItems") or {}]
    table = body.get("TableName") or body.get("TableArn") or body.get("ResourceArn")
    if not table:
        return [(f"dynamodb:{operation}", "*")]
    resource = arn(table)
    if body.get("IndexName"):
        resource += f"/index/{body['IndexName']}"
    return [(f"dynamodb:{operation}", resource)]


def _dynamodb_authorize(self: DynamoHandler, resource: str = "*") -> None:
    checks = dynamodb_checks(
        self._get_action(), getattr(self, "body", None) or {}, self.region, self.current_account
    )
    self._authenticate_and_authorize_action(PerActionIAMRequest, checks)


def _sqs_authorize(self: SQSResponse, resource: str = "*") -> None:
    operation = self._get_action()
    self._authenticate_and_authorize_action(
        PerActionIAMRequest, [(f"sqs:{_SQS_BATCH.get(operation, operation)}", resource)]
    )


def _secrets_authorize(self: SecretsManagerResponse, resource: str = "*") -> None:
    self._authenticate_and_authorize_action(
        PerActionIAMRequest, [(f"secretsmanager:{self._get_action()}", resource)]
    )


def events_checks(operation: str, body: dict[str, Any], region: str, account: str) -> list[tuple[str, str]]:
    """The (IAM action, resource ARN) pairs AWS authorizes for one EventBridge call: PutEvents on each
    entry's bus (`EventBusName`, a name or an ARN; default `default`), other calls on `*`."""
    if operation != "PutEvents":
        return [(f"events:{operation}", "*")]
    buses = {entry.get("EventBusName") or "default" for entry in body.get("Entries") or []} or {"default"}
    return [
        (
            "events:PutEvents",
            bus if bus.startswith("arn:") else f"arn:aws:events:{region}:{account}:event-bus/{bus}",
        )
        for bus in sorted(buses)
    ]


def _events_authorize(self: EventsHandler, resource: str = "*") -> None:
    # moto checks every EventBridge call on "*", which SAM's EventBridgePutEventsPolicy (the bus's ARN)
    # never matches.
    body = json.loads(self.body or "{}") if isinstance(self.body, str | bytes) else {}
    checks = events_checks(self._get_action(), body, self.region, self.current_account)
    self._authenticate_and_authorize_action(PerActionIAMRequest, checks)


class PresignedS3IAMRequest(S3IAMRequest):
    """An S3 request signed in its query string (a presigned URL): signature, expiry, then policies.

    moto 5.2.5 builds every IAMRequest from the Authorization header, so with enforcement on a presigned
    URL fails with KeyError 'HTTP_AUTHORIZATION' (HTTP 500) in IAMRequestBase.__init__. Both query
    signatures botocore makes are checked: SigV2 (AWSAccessKeyId/Signature/Expires; boto3's default
    for S3 presigning in regions that accept SigV2, e.g. us-east-1) and SigV4 (X-Amz-Credential ...).
    """

    REGION = "us-east-1"  # a SigV2 URL names no region; the local stack has one

    def __init__(
        self,
        account_id: str,
        method: str,
        path: str,
        data: dict[str, str],
        body: bytes,
        headers: dict[str, str],
        action: str,
    ) -> None:
        self.account_id, self._method, self._path, self._data, self._body = (
            account_id,
            method,
            path,
            data,
            body,
        )
        self._raw_query = urlparse(path).query
        self._query = {k: v[0] for k, v in parse_qs(self._raw_query, keep_blank_values=True).items()}
        self._v4 = "X-Amz-Credential" in self._query
        if self._v4:
            key_id, _, self._region, self._service, _ = self._query["X-Amz-Credential"].split("/")
        else:
            key_id, self._region, self._service = self._query["AWSAccessKeyId"], self.REGION, "s3"
        self._action = f"{self._service}:{action[0] if isinstance(action, list) else action}"
        self._headers = dict(headers)
        token = self._query.get("X-Amz-Security-Token") or self._query.get("x-amz-security-token")
        if token:
            self._headers["X-Amz-Security-Token"] = token
        try:
            self._access_key = create_access_key(
                account_id=account_id,
                partition=get_partition(self._region),
                access_key_id=key_id,
                headers=self._headers,
            )
        except CreateAccessKeyFailure as e:
            self._raise_invalid_access_key(e.reason)

    def check_signature(self) -> None:
        if self._v4:
            signed = dt.datetime.strptime(self._query["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
            expires_at = signed + dt.timedelta(seconds=int(self._query.get("X-Amz-Expires", "3600")))
        else:
            expires_at = dt.datetime.fromtimestamp(int(self._query["Expires"]), dt.UTC)
        if dt.datetime.now(dt.UTC) > expires_at:
            self._raise_access_denied()  # S3: AccessDenied "Request has expired"
        if (self._v4_signature() if self._v4 else self._v2_signature()) != self._query.get(
            "X-Amz-Signature" if self._v4 else "Signature"
        ):
            self._raise_signature_does_not_match()

    def _v4_signature(self) -> str:
        unsigned_query = "&".join(
            p for p in self._raw_query.split("&") if not p.startswith("X-Amz-Signature=")
        )
        # Every header the URL signed (X-Amz-SignedHeaders: host, and e.g. content-length and
        # content-type of an upload URL), with the values this request sent: a PUT of another size or
        # type does not match, as on S3.
        sent = {name.lower(): value for name, value in self._headers.items()}
        signed = self._query.get("X-Amz-SignedHeaders", "host").split(";")
        request = AWSRequest(
            method=self._method,
            url=f"http://{sent.get('host')}{urlparse(self._path).path}?{unsigned_query}",
            headers={name: sent.get(name, "") for name in signed},
        )
        request.context["timestamp"] = self._query["X-Amz-Date"]
        auth = S3SigV4QueryAuth(
            self._access_key.create_credentials(),
            self._service,
            self._region,
            expires=int(self._query.get("X-Amz-Expires", "3600")),
        )
        return auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)

    def _v2_signature(self) -> str:
        # https://docs.aws.amazon.com/AmazonS3/latest/userguide/RESTAuthentication.html#RESTAuthenticationQueryStringAuth
        q = self._query
        lines = [self._method.upper(), q.get("content-md5", ""), q.get("content-type", ""), q["Expires"]]
        lines += [
            f"{k.lower()}:{v}"
            for k, v in sorted(q.items(), key=lambda kv: kv[0].lower())
            if k.lower().startswith("x-amz-")
        ]
        auth = HmacV1Auth(self._access_key.create_credentials())
        resource = auth.canonical_resource(urlparse("http://local" + self._path))
        return auth.sign_string("\n".join(lines) + "\n" + resource)


class AnonymousS3IAMRequest(S3IAMRequest):
    """An S3 request with no signature at all: private buckets deny it (moto: KeyError, HTTP 500)."""

    def __init__(
        self,
        account_id: str,
        method: str,
        path: str,
        data: dict[str, str],
        body: bytes,
        headers: dict[str, str],
        action: str,
    ) -> None:
        self._data = data
        self._raise_access_denied()


_original_s3_authorize = ActionAuthenticatorMixin._authenticate_and_authorize_s3_action


class ExpectedBucketOwnerDenied(S3ClientError):
    """S3's answer to a request whose `x-amz-expected-bucket-owner` is not the bucket's account."""

    code = 403

    def __init__(self) -> None:
        super().__init__("AccessDenied", "Access Denied")


def _s3_authorize(self: Any, bucket_name: str | None = None, key_name: str | None = None) -> None:
    # moto 5.2.5 ignores ExpectedBucketOwner; S3 answers 403 AccessDenied when the bucket's account
    # differs (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucket-owner-condition.html).
    expected = self.headers.get("x-amz-expected-bucket-owner")
    bucket = self.backend.buckets.get(bucket_name) if expected and bucket_name else None
    if bucket is not None and bucket.account_id != expected:
        raise ExpectedBucketOwnerDenied()
    if "Authorization" in self.headers:
        return _original_s3_authorize(self, bucket_name, key_name)
    arn = f"{bucket_name or '*'}/{key_name}" if key_name else (bucket_name or "*")
    resource = f"arn:{get_partition(self.region)}:s3:::{arn}"
    query = urlparse(self.uri).query or ""
    presigned = "X-Amz-Credential=" in query or "AWSAccessKeyId=" in query
    self._authenticate_and_authorize_action(
        PresignedS3IAMRequest if presigned else AnonymousS3IAMRequest, resource
    )


def _secret_resource(self: SecretsManagerResponse) -> str:
    secret_id = self._get_param("SecretId")
    if not secret_id:
        return "*"
    secret = self.backend.secrets.get(secret_id)
    if secret is not None:
        return secret.arn
    # AWS evaluates a missing secret's name ARN (no random suffix):
    # no permission -> AccessDenied, not NotFound.
    return (
        secret_id
        if secret_id.startswith("arn:")
        else f"arn:aws:secretsmanager:{self.region}:{self.current_account}:secret:{secret_id}"
    )


def _iam_glob(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    regex = "^" + re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".") + "$"
    return re.compile(regex, re.IGNORECASE if ignore_case else 0)


def _check_element_matches(self: IAMPolicyStatement, statement_element: Any, value: str) -> bool:
    patterns = self._statement[statement_element]
    patterns = patterns if isinstance(patterns, list) else [patterns]
    ignore_case = statement_element in ("Action", "NotAction")
    return any(_iam_glob(str(p), ignore_case).match(value) for p in patterns)


_MISSING = object()
_saved: dict[tuple[int, str], tuple[Any, Any]] = {}


def _patch(owner: Any, name: str, value: Any) -> None:
    old = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else owner.get(name, _MISSING)
    _saved.setdefault((id(owner), name), (owner, old))
    if isinstance(owner, type):
        setattr(owner, name, value)
    else:
        owner[name] = value


def install() -> None:
    """Make moto authorize DynamoDB, SQS, Secrets Manager and S3 HeadBucket calls as AWS does (idempotent)."""
    _patch(DynamoHandler, "_authenticate_and_authorize_normal_action", _dynamodb_authorize)
    _patch(SQSResponse, "_authenticate_and_authorize_normal_action", _sqs_authorize)
    _patch(EventsHandler, "_authenticate_and_authorize_normal_action", _events_authorize)
    _patch(SecretsManagerResponse, "_determine_resource", _secret_resource)
    _patch(SecretsManagerResponse, "_authenticate_and_authorize_normal_action", _secrets_authorize)
    _patch(s3_responses.S3Response, "_authenticate_and_authorize_s3_action", _s3_authorize)
    _patch(IAMPolicyStatement, "_check_element_matches", _check_element_matches)
    _patch(s3_responses.ACTION_MAP["BUCKET"]["HEAD"], "DEFAULT", "ListBucket")


def uninstall() -> None:
    """Restore moto's own behaviour."""
    for (_, name), (owner, value) in _saved.items():
        if isinstance(owner, type):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        elif value is _MISSING:
            owner.pop(name, None)
        else:
            owner[name] = value
    _saved.clear()
