"""What a batch's validation reports: `LineError`s `{code, message, param, line}` with OpenAI's error codes.

`line_errors` words pydantic's errors of one line's envelope or body as `LineError`s.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from batchinfer.wire.messages import describe, loc_path


class ErrorCode(StrEnum):
    """The `code` values of `LineError`, named like the OpenAI Batch API's validation errors."""

    INVALID_JSON_LINE = "invalid_json_line"
    INVALID_ENCODING = "invalid_encoding"
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    INVALID_PARAMETER = "invalid_parameter"
    DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
    URL_MISMATCH = "url_mismatch"
    INVALID_URL = "invalid_url"
    STREAMING_UNSUPPORTED = "streaming_unsupported"
    MODEL_MISMATCH = "model_mismatch"
    MODEL_NOT_FOUND = "model_not_found"
    ENDPOINT_NOT_SUPPORTED = "endpoint_not_supported"
    EMPTY_FILE = "empty_file"
    TOO_MANY_TASKS = "too_many_tasks"
    FILE_TOO_LARGE = "file_too_large"
    LINE_TOO_LARGE = "line_too_large"


class LineError(BaseModel):
    """One `errors.data[]` entry of a failed batch: `line` is 1-based, `None` for file-level errors."""

    model_config = ConfigDict(frozen=True)

    code: str
    message: str
    param: str | None = None
    line: int | None = None


def line_errors(exc: ValidationError, line: int, prefix: str, expected: dict[str, str]) -> list[LineError]:
    """Translate pydantic errors into `LineError`s whose `param` is `prefix` + the top-level field.

    A missing top-level field is `missing_required_parameter`; anything else (wrong type or value,
    also deeper inside, e.g. `body.messages[0].role`) is `invalid_parameter`, with the sentence in
    `expected` (keyed by top-level field) when there is one, else pydantic's own message.
    """
    out = []
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        param, path = f"{prefix}{loc[0]}", f"{prefix}{loc_path(loc)}"
        if err["type"] == "missing":
            code = ErrorCode.MISSING_REQUIRED_PARAMETER if len(loc) == 1 else ErrorCode.INVALID_PARAMETER
            message = f"Line {line}: {path} is missing."
        elif len(loc) == 1 and loc[0] in expected:
            code = ErrorCode.INVALID_PARAMETER
            message = f"Line {line}: {path} must be {expected[str(loc[0])]}, got {describe(err['input'])}."
        else:
            code = ErrorCode.INVALID_PARAMETER
            message = f"Line {line}: invalid {path}: {_reason(err)}; got {describe(err['input'])}."
        out.append(LineError(code=code, message=message, param=param, line=line))
    return out


# Pydantic's words for JSON types, where its own name in the message would be a Python one.
_TYPE_REASONS = {
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be an array",
}


def _reason(err: ErrorDetails) -> str:
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])  # our own validators' sentences, without "Value error, "
    return _TYPE_REASONS.get(err["type"], err["msg"])
