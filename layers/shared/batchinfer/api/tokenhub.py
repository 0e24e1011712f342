"""Where a new batch reads its input and writes its results, in either dialect of `POST /v1/batches`.

OpenAI: `input_file_id` is a file uploaded with purpose `batch`; results become service files.
TokenHub: `input_source` `user_s3` / `user_cos` makes `input_file_id` a path in the user's storage,
and `output_target` `user_s3` / `user_cos` writes `output.jsonl` / `error.jsonl` under
`output_user_s3_path` / `output_user_cos_path` + `<batch_id>/` (one folder per batch, so two batches
with the same output path never overwrite each other).

Access rules, checked before any read: a user bucket must be on the account's allowlist (`403
bucket_not_allowed`, whether or not the bucket exists, so nothing leaks), the service's own bucket is
never a user bucket, the input must be readable now (`400 input_file_unavailable`) and the output
bucket must exist (`400 output_path_unavailable`).
"""

from __future__ import annotations

from dataclasses import dataclass

from batchinfer.api.errors import ApiError, Forbidden
from batchinfer.api.files import owned_file
from batchinfer.core.settings import get_settings
from batchinfer.data import locations
from batchinfer.data.items import Account
from batchinfer.data.locations import InvalidPath, Location, Unavailable
from batchinfer.wire.openai import CHAT_ENDPOINT, CreateBatchRequest, OutputTarget

_SCHEME = {"user_s3": "s3", "user_cos": "cos"}
_PATH_FIELD = {"user_s3": "output_user_s3_path", "user_cos": "output_user_cos_path"}


@dataclass(frozen=True)
class Plan:
    """What `intake.create_batch` needs to know about a request's input and output."""

    endpoint: str
    input_bucket: str
    input_key: str
    input_where: str = ""
    output: Location | None = None  # None: the service bucket, batches/<id>/
    output_target: OutputTarget = "file"

    def output_prefix(self, batch_id: str) -> str | None:
        """The key prefix of the batch's result files in the output bucket (None: the default)."""
        return None if self.output is None else f"{self.output.key}{batch_id}/"


def _allowed(location: Location, account: Account, param: str) -> None:
    own = location.bucket_ref == f"s3://{get_settings().bucket_name}"
    if own or not account.allows_key(location.bucket_ref, location.key):
        raise Forbidden(
            f"This account may not use bucket {location.bucket_ref!r}; ask the operator to add "
            "it to the account's bucket allowlist.",
            code="bucket_not_allowed",
            param=param,
        )


def _parse(path: str, scheme: str, param: str, *, prefix: bool) -> Location:
    try:
        location = locations.parse(path, scheme, prefix=prefix)  # type: ignore[arg-type]
        locations.s3_client(location.where)  # COS must be configured on this deployment
    except InvalidPath as error:
        raise ApiError(f"{param}: {error}", code="invalid_path", param=param) from None
    return location


def _output_target(request: CreateBatchRequest) -> OutputTarget:
    given = [source for source, name in _PATH_FIELD.items() if getattr(request, name) is not None]
    target = request.output_target or (given[0] if len(given) == 1 else "file")
    for source, name in _PATH_FIELD.items():
        if source != target and getattr(request, name) is not None:
            raise ApiError(
                f"{name} goes with output_target '{source}', not '{target}'",
                code="invalid_parameter",
                param=name,
            )
    if target != "file" and getattr(request, _PATH_FIELD[target]) is None:
        raise ApiError(
            f"output_target '{target}' needs {_PATH_FIELD[target]}",
            code="missing_required_parameter",
            param=_PATH_FIELD[target],
        )
    return target


def plan(request: CreateBatchRequest, account: Account, account_id: str) -> Plan:
    """Check a create request's source and target against the account; raises `ApiError` (400, 403, 404)."""
    source = request.input_source
    if source == "file" and request.endpoint is None:
        raise ApiError(
            "Missing required parameter: 'endpoint'.", code="missing_required_parameter", param="endpoint"
        )
    endpoint = request.endpoint or CHAT_ENDPOINT
    target = _output_target(request)
    if source == "file":
        input_file = owned_file(request.input_file_id, account_id)
        if input_file.purpose != "batch":
            raise ApiError(
                f"file {request.input_file_id} has purpose {input_file.purpose!r}, not 'batch'",
                code="invalid_file_purpose",
                param="input_file_id",
            )
        inputs = (input_file.bucket, input_file.key, input_file.where or "")
    else:
        location = _parse(request.input_file_id, _SCHEME[source], "input_file_id", prefix=False)
        _allowed(location, account, "input_file_id")
        inputs = (location.bucket, location.key, location.where)
    output = None
    if target != "file":
        param = _PATH_FIELD[target]
        output = _parse(getattr(request, param), _SCHEME[target], param, prefix=True)
        _allowed(output, account, param)
    # Reads only after every bucket passed the allowlist.
    if source != "file":
        try:
            locations.check_readable(location)
        except Unavailable as error:
            raise ApiError(
                f"The input file {request.input_file_id} cannot be read ({error.code}).",
                code="input_file_unavailable",
                param="input_file_id",
            ) from None
    if output is not None:
        try:
            locations.check_bucket(output)
        except Unavailable as error:
            raise ApiError(
                f"The output path cannot be used ({error.code}).",
                code="output_path_unavailable",
                param=_PATH_FIELD[target],
            ) from None
    return Plan(
        endpoint=endpoint,
        input_bucket=inputs[0],
        input_key=inputs[1],
        input_where=inputs[2],
        output=output,
        output_target=target,
    )
