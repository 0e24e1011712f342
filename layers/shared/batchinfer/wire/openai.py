"""Wire shapes of the Batch and Files APIs (OpenAI Batch API, https://platform.openai.com/docs/api-reference/batch).

Times are Unix seconds; `None` serialises as JSON null, as the OpenAI SDK expects.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from batchinfer.wire.status import BatchStatus

CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"
RESPONSES_ENDPOINT = "/v1/responses"
EMBEDDINGS_ENDPOINT = "/v1/embeddings"
TOKEN_ENDPOINT = "/v2/models/{model}/infer"
InputSource = Literal["file", "user_s3", "user_cos"]
OutputTarget = Literal["file", "user_s3", "user_cos"]
# Batch endpoints: the OpenAI urls served (every template of `batchinfer.endpoints.registry` but the
# `/v2` one), or token inference on one model (KServe v2 / MindIE).
OPENAI_BATCH_URLS = (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    RESPONSES_ENDPOINT,
    EMBEDDINGS_ENDPOINT,
)
ENDPOINT_PATTERN = (
    "^(" + "|".join(map(re.escape, OPENAI_BATCH_URLS)) + r"|/v2/models/[A-Za-z0-9._-]{1,256}/infer)$"
)
_WINDOW = re.compile(r"^(\d{1,3})h$")
MIN_WINDOW_HOURS, MAX_WINDOW_HOURS = 1, 168
WINDOW_PATTERN = r"^[1-9][0-9]{0,2}h$"
# The sentence that replaces pydantic's "String should match pattern '...'" for each pattern of a
# request body: a user should not have to read a regex (the OpenAPI document still shows them).
PATTERN_RULES = {
    ENDPOINT_PATTERN: "is not a batch endpoint: use "
    + ", ".join(f'"{url}"' for url in OPENAI_BATCH_URLS)
    + ', or "/v2/models/{model}/infer" for KServe v2 token requests',
    WINDOW_PATTERN: f'is not a completion window: give whole hours from "{MIN_WINDOW_HOURS}h" to '
    f'"{MAX_WINDOW_HOURS}h", e.g. "24h"',
}
# Path ids longer than this can't name anything we store (and DynamoDB keys are capped at 2 KB).
MAX_ID_LENGTH = 128


def window_hours(window: str) -> int:
    """Hours of a `completion_window` such as `24h`; whole hours in [1, 168], else `ValueError`."""
    match = _WINDOW.match(window)
    hours = int(match.group(1)) if match else 0
    if not MIN_WINDOW_HOURS <= hours <= MAX_WINDOW_HOURS:
        raise ValueError(f"completion_window must be whole hours from '1h' to '168h', got {window!r}")
    return hours


def _is_unicode(text: str) -> bool:
    """False for a string holding a lone UTF-16 surrogate (`"\\ud800"` in JSON): no storage takes it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    # OpenAI: at most 16 pairs, keys up to 64 and values up to 512 characters.
    if value is None:
        return None
    if len(value) > 16:
        raise ValueError("metadata may have at most 16 key-value pairs")
    for key, item in value.items():
        if not key:  # DynamoDB keeps no empty map key: the batch could not be read back
            raise ValueError("metadata keys must not be empty")
        if not _is_unicode(key) or not _is_unicode(item):
            raise ValueError(
                "metadata keys and values must be Unicode text (no lone surrogates, such as \\ud800)"
            )
        if len(key) > 64:
            raise ValueError(f"metadata key {key[:20]!r}... is longer than 64 characters")
        if len(item) > 512:
            raise ValueError(f"metadata value of {key!r} is longer than 512 characters")
    return value


Metadata = Annotated[dict[str, str] | None, AfterValidator(_check_metadata)]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_filename(name: str) -> str:
    """`name` if it can be a file's name: no control characters (a CR/LF or NUL in a name shown in
    headers and terminals is an attack, never a name). Paths are fine: a name is never a storage key."""
    if _CONTROL.search(name):
        raise ValueError("the file name must not contain control characters (U+0000 to U+001F, U+007F)")
    return name


Filename = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(check_filename)]


class ErrorBody(BaseModel):
    """The body of an OpenAI error envelope."""

    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(BaseModel):
    """`{"error": {message, type, param, code}}`, the body of every 4xx/5xx of /v1."""

    error: ErrorBody


class RequestCounts(BaseModel):
    """Requests of a batch: `total == completed + failed` once the batch is terminal."""

    total: int = 0
    completed: int = 0
    failed: int = 0


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    """Token totals over every successful request of a batch."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()

    @model_validator(mode="before")
    @classmethod
    def _flat_cached_tokens(cls, data: Any) -> Any:
        # The batch header keeps its totals flat (`data.items.TokenTotals.cached_tokens`).
        if isinstance(data, dict) and "cached_tokens" in data and "input_tokens_details" not in data:
            data = {**data, "input_tokens_details": {"cached_tokens": data["cached_tokens"]}}
        return data


class LineErrorOut(BaseModel):
    """One `errors.data[]` entry: a problem found while validating the input file."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[LineErrorOut] = []


class Batch(BaseModel):
    """The OpenAI Batch object."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: BatchErrors | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = RequestCounts()
    usage: Usage = Usage()
    metadata: dict[str, str] | None = None
    name: str | None = None
    # TokenHub dialect: where the input came from and where the results go. For user_s3/user_cos
    # output, output_file_id/error_file_id are the s3:// or cos:// paths of the result objects and the
    # *_url fields short-lived presigned download URLs of them (fresh on every retrieve).
    input_source: InputSource = "file"
    output_target: OutputTarget = "file"
    output_user_s3_path: str | None = None
    output_user_cos_path: str | None = None
    output_file_url: str | None = None
    error_file_url: str | None = None


class BatchList(BaseModel):
    """A page of `GET /v1/batches`, newest first."""

    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class OutputExpiresAfter(BaseModel):
    """OpenAI's `output_expires_after` of a batch create: the output and error files expire `seconds`
    after the batch's `created_at` (the only anchor), from 1 hour to 30 days
    (https://platform.openai.com/docs/api-reference/batch/create)."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=2592000, description="3600 (1 hour) to 2592000 (30 days)")


class CreateBatchRequest(BaseModel):
    """Body of `POST /v1/batches`, in either dialect.

    OpenAI (https://platform.openai.com/docs/api-reference/batch/create): `input_file_id` names an
    uploaded file, `endpoint` is required. TokenHub: `input_source` `user_s3` / `user_cos` makes
    `input_file_id` an `s3://bucket/key` / `cos://bucket.region/key` path, `endpoint` defaults to
    `/v1/chat/completions`, and `output_target` `user_s3` / `user_cos` writes the results under
    `output_user_s3_path` / `output_user_cos_path` instead of the service's files. Cross-field rules
    (which path goes with which source) are checked by the route, which names the offending field.
    """

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=2048)
    endpoint: str | None = Field(
        None,
        pattern=ENDPOINT_PATTERN,
        description=", ".join(OPENAI_BATCH_URLS) + " or /v2/models/{model}/infer (KServe v2 token "
        "requests); required unless input_source is user_s3 or user_cos",
    )
    completion_window: str = Field("24h", pattern=WINDOW_PATTERN, description="whole hours, '1h' to '168h'")
    metadata: Metadata = None
    output_expires_after: OutputExpiresAfter | None = Field(
        None, description="when the output and error files expire (files the service stores only)"
    )
    name: str | None = Field(None, max_length=256)
    input_source: InputSource = "file"
    output_target: OutputTarget | None = Field(
        None, description="default: the user_* of the output path given, else file"
    )
    output_user_s3_path: str | None = Field(None, max_length=2048, description="s3://bucket/prefix/")
    output_user_cos_path: str | None = Field(None, max_length=2048, description="cos://bucket.region/prefix/")
    dry_run: bool = Field(
        False, description="true: check the file and estimate its tokens and cost; no batch is created"
    )


class FileObject(BaseModel):
    """The OpenAI File object."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    """A page of `GET /v1/files`."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class CreateUploadRequest(BaseModel):
    """Body of `POST /v1/uploads`: announce a file too large for `POST /v1/files` (OpenAI's Upload
    object fields, https://platform.openai.com/docs/api-reference/uploads/create)."""

    model_config = ConfigDict(extra="forbid")

    filename: Filename
    purpose: Literal["batch"]
    bytes: int = Field(ge=1, description="exact size of the file that will be PUT to upload_url")
    mime_type: str = Field("application/jsonl", min_length=1, max_length=255)


MAX_UPLOAD_PARTS = 10_000  # S3's own limit on the parts of one multipart upload


class CompleteUploadRequest(BaseModel):
    """Body of `POST /v1/uploads/{upload_id}/complete`
    (https://platform.openai.com/docs/api-reference/uploads/complete): the parts in the file's order,
    or none when the bytes went to `upload_url`; `md5` (hex) of the whole file, checked when given."""

    model_config = ConfigDict(extra="forbid")

    part_ids: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_UPLOAD_PARTS,
        description="the parts in order; none: the bytes were PUT to upload_url",
    )
    md5: Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{32}$")] | None = Field(
        None, description="MD5 of the whole file, 32 hex digits"
    )


class UploadPartObject(BaseModel):
    """OpenAI's Upload Part object (https://platform.openai.com/docs/api-reference/uploads/part-object)."""

    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str


class Upload(BaseModel):
    """OpenAI's Upload object, plus the presigned `upload_url` that takes the file's bytes in one PUT."""

    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"]
    file: FileObject | None = None
    upload_url: str | None = Field(
        None, description="PUT the file's bytes here, then complete (pending only)"
    )
    upload_method: Literal["PUT"] = "PUT"
    upload_headers: dict[str, str] = Field(
        default_factory=dict, description="headers the PUT must send (signed: exactly this type and size)"
    )


class Model(BaseModel):
    """OpenAI's Model object (https://platform.openai.com/docs/api-reference/models/object):
    `created` in Unix seconds, `owned_by` here the backend that serves it (llama_cpp, openai, ...);
    one field of ours, `endpoints`: the batch endpoints (templates) a line may use it with."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    endpoints: list[str] = Field(default_factory=list)


class ModelList(BaseModel):
    """`GET /v1/models`: every model of the registry, in its order."""

    object: Literal["list"] = "list"
    data: list[Model]


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


def result_line(
    *,
    line_id: str,
    custom_id: str,
    status_code: int | None,
    request_id: str | None,
    body: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One line of output.jsonl / error.jsonl in the OpenAI batch output shape.

    A request that ran has `response {status_code, request_id, body}` and `error: null`; one that never
    ran (expired, cancelled) has `response: null` and `error {code, message}`.
    """
    response = (
        None if status_code is None else {"status_code": status_code, "request_id": request_id, "body": body}
    )
    return {"id": line_id, "custom_id": custom_id, "response": response, "error": error}


def result_line_bytes(
    *,
    line_id: str,
    custom_id: str,
    status_code: int | None,
    request_id: str | None,
    body: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> bytes:
    """`result_line` as the bytes of one JSON Lines line: compact UTF-8 JSON and its `\n`.

    A string no UTF-8 can carry (a lone surrogate, which a `custom_id` or a model's answer may hold)
    is written as its JSON escape (`\ud800`): the line stays valid JSON and the file valid UTF-8.
    """
    line = result_line(
        line_id=line_id,
        custom_id=custom_id,
        status_code=status_code,
        request_id=request_id,
        body=body,
        error=error,
    )
    try:
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    except UnicodeEncodeError:
        return json.dumps(line, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"
