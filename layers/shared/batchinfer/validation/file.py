"""Validation of a batch input file, line by line, as the `prepare` step streams it.

The file format and error codes follow the OpenAI Batch API
(https://platform.openai.com/docs/api-reference/batch/request-input and the `errors.data[]` entries
of the Batch object): every non-blank line is `{"custom_id", "method": "POST", "url", "body"}`.
Problems are reported as `LineError`s `{code, message, param, line}`, where `line` is the 1-based
physical line (blank lines count) and `param` the dotted path of the offending field.

What is checked here, and what is not:
- Checked: UTF-8, JSON, the request envelope, unique `custom_id`s, the url, the request body of the
  endpoint (see `ENDPOINTS`), one known model per file, and the file limits.
- Not checked (the worker answers these per line at run time, without failing the file): a prompt
  longer than the model's context, lone surrogate escapes (`"\\ud800"`) and NUL characters
  (`"\\u0000"`) inside strings. They are valid JSON, and one such line must not fail a whole batch.

Each line is checked in stages (encoding, JSON, envelope, url, body, model); every problem of the
first failing stage is reported and the later stages are skipped for that line, so one mistake
(say a missing `body`) does not cascade into several errors.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import IO, Annotated, Any, Literal, NamedTuple

import orjson
from rbloom import Bloom

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from batchinfer.wire.kserve import InferError, parse_infer_request
from batchinfer.validation.jsonl import MAX_JSON_DEPTH, PhysicalLine, iter_physical_lines, nested_deeper_than
from batchinfer.wire.openai import CHAT_ENDPOINT

# --------------------------------------------------------------------------------------------------
# Results


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


class RequestLine(NamedTuple):
    """A valid request line. `body` is the parsed body exactly as given (unknown fields kept, nothing
    coerced); `model` is the model it runs on (`body.model`, or the `{model}` of a `/v2` url).

    `body` may hold lone surrogates (`"\\ud800"`): serialise it with `json.dumps(ensure_ascii=True)`.
    A named tuple rather than a frozen dataclass: one is made per line, and it is made 4x faster.
    """

    line: int
    custom_id: str
    method: str
    url: str
    body: dict[str, Any]
    model: str


# --------------------------------------------------------------------------------------------------
# Describing values in messages


_JSON_TYPES: dict[type, str] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}
_SHOWN_CHARS = 60


def _safe(text: str) -> str:
    # Messages end up in UTF-8 JSON: escape lone surrogates instead of failing to encode them.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(value: Any) -> str:
    """`integer 17`, `string "10"`, `boolean true`, `null`, ...: the JSON type and value, shortened."""
    if value is None:
        return "null"
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > _SHOWN_CHARS:
        text = text[: _SHOWN_CHARS - 3] + "..."
    return f"{_JSON_TYPES.get(type(value), type(value).__name__)} {_safe(text)}"


def _quote(text: str) -> str:
    """A string for a message: quoted so that spaces and case show, shortened, surrogates escaped."""
    shown = text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
    return _safe(repr(shown))


def _pydantic_errors(
    exc: ValidationError, line: int, prefix: str, expected: dict[str, str]
) -> list[LineError]:
    """Translate pydantic errors into `LineError`s whose `param` is the top-level field.

    A missing top-level field is `missing_required_parameter`; anything else (wrong type or value,
    also deeper inside, e.g. `body.messages[0].role`) is `invalid_parameter`, with the sentence in
    `expected` for the field when there is one, else pydantic's own message.
    """
    out = []
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        param = f"{prefix}{loc[0]}"
        path = param + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
        if err["type"] == "missing":
            if len(loc) == 1:
                code, message = ErrorCode.MISSING_REQUIRED_PARAMETER, f"Line {line}: {path} is missing."
            else:
                code, message = ErrorCode.INVALID_PARAMETER, f"Line {line}: {path} is missing."
        elif len(loc) == 1 and param in expected:
            code = ErrorCode.INVALID_PARAMETER
            message = f"Line {line}: {path} must be {expected[param]}, got {_describe(err['input'])}."
        else:
            code = ErrorCode.INVALID_PARAMETER
            message = f"Line {line}: invalid {path}: {_reason(err)}; got {_describe(err['input'])}."
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


def _non_empty(value: str) -> str:
    # A validator rather than `min_length`: pydantic's constrained strings reject lone surrogates,
    # which must pass validation here (the worker answers them per line).
    if not value:
        raise ValueError("must not be empty")
    return value


NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]


# --------------------------------------------------------------------------------------------------
# The request envelope


class _Envelope(BaseModel):
    """A request line of the OpenAI batch input format; unknown top-level keys are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")

    custom_id: NonEmptyStr
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


_ENVELOPE_EXPECTED = {
    "custom_id": "a non-empty string",
    "method": '"POST"',
    "url": f'a string such as "{CHAT_ENDPOINT}"',
    "body": "a JSON object",
}


# --------------------------------------------------------------------------------------------------
# Request bodies, one checker per endpoint


Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


def _check_content(value: Any) -> Any:
    # OpenAI chat content: a string, or an array of content parts `{"type": ..., ...}`.
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in value):
        return value
    raise ValueError('content must be a string or an array of content parts {"type": ...}')


class ChatMessage(BaseModel):
    """One chat message: a `role` and a `content` (other OpenAI message fields pass through)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    role: Role
    content: Annotated[Any, AfterValidator(_check_content)]

    @model_validator(mode="after")
    def _null_content_only_for_assistant(self) -> ChatMessage:
        # OpenAI allows a null content only for an assistant message that carries tool calls.
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content may be null only in an assistant message, not in a {self.role} one")
        return self


def _check_stop(value: Any) -> Any:
    # OpenAI: "Up to 4 sequences where the API will stop generating further tokens."
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) <= 4 and all(isinstance(s, str) for s in value):
        return value
    raise ValueError("stop must be a string or an array of up to 4 strings")


class ChatCompletionBody(BaseModel):
    """The checked fields of a `/v1/chat/completions` body (OpenAI Chat Completions API).

    Strict types: `true` is not an integer, `1.5` and `"10"` are not a `max_tokens`; `null` means
    "not given". Unknown fields are allowed, as OpenAI passes them through. `stream` must not be
    true (a batch has nowhere to stream to); `n` must be 1 (one result line per request).
    """

    model_config = ConfigDict(strict=True, extra="ignore")

    model: NonEmptyStr
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stop: Annotated[Any, AfterValidator(_check_stop)] = None
    seed: int | None = None
    stream: bool | None = None


_CHAT_EXPECTED = {
    "body.model": "a non-empty string",
    "body.messages": "a non-empty array of messages, each an object with a role and a content",
    "body.max_tokens": "a positive integer or null",
    "body.max_completion_tokens": "a positive integer or null",
    "body.temperature": "a number from 0 to 2",
    "body.top_p": "a number from 0 to 1",
    "body.n": "1 (one choice per request in a batch)",
    "body.stop": "a string or an array of up to 4 strings",
    "body.seed": "an integer",
    "body.stream": "a boolean",
}


# ---- The common case, fast. pydantic explains precisely what is wrong with a line but costs ~8 µs
# per line, several times the JSON parsing; nearly every line is right. These checks accept only
# values the models accept too (never the reverse: anything unusual goes on to pydantic, which
# then reports as before), in ~1 µs. They must cover every field of the models they stand for:
# the assertions below fail at import when a field is added without its check.


def _plain_str(value: Any) -> bool:
    return type(value) is str and value != ""


_ROLES = frozenset(Role.__args__)  # type: ignore[attr-defined]
_INT64 = 2**63
# The body fields `_plain_chat_body` checks, one by one below (inline: a call per field costs more
# than the check).
_PLAIN_CHAT_FIELDS = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "temperature",
                                "top_p", "n", "stop", "seed", "stream"})
assert _PLAIN_CHAT_FIELDS == set(ChatCompletionBody.model_fields)
assert set(ChatMessage.model_fields) == {"role", "content"}


def _plain_chat_body(body: dict[str, Any]) -> bool:
    """True only for a body that `ChatCompletionBody` accepts (False says nothing)."""
    get = body.get
    messages, model = get("messages"), get("model")
    if type(messages) is not list or not messages or type(model) is not str or not model:
        return False
    for message in messages:
        if type(message) is not dict:
            return False
        role = message.get("role")
        if type(role) is not str or role not in _ROLES or type(message.get("content")) is not str:
            return False
    if (value := get("max_tokens")) is not None and not (type(value) is int and 0 < value < _INT64):
        return False
    if (value := get("max_completion_tokens")) is not None and not (type(value) is int and 0 < value < _INT64):
        return False
    if (value := get("temperature")) is not None and not (type(value) in (int, float) and 0 <= value <= 2):
        return False
    if (value := get("top_p")) is not None and not (type(value) in (int, float) and 0 <= value <= 1):
        return False
    if (value := get("n")) is not None and not (type(value) is int and value == 1):
        return False
    if (value := get("seed")) is not None and not (type(value) is int and -_INT64 <= value < _INT64):
        return False
    if (value := get("stream")) is not None and value is not False:
        return False
    value = get("stop")
    return value is None or type(value) is str or (
        type(value) is list and len(value) <= 4 and all(type(item) is str for item in value))


def check_chat_body(body: dict[str, Any], line: int) -> list[LineError]:
    """Errors of a `/v1/chat/completions` body (empty when valid); see `ChatCompletionBody`."""
    if _plain_chat_body(body):
        return []
    errors = []
    if body.get("stream") is True:
        errors.append(
            LineError(
                code=ErrorCode.STREAMING_UNSUPPORTED,
                message=f'Line {line}: "stream": true is not supported in a batch; '
                "remove it or set it to false.",
                param="body.stream",
                line=line,
            )
        )
    try:
        ChatCompletionBody.model_validate(body)
    except ValidationError as exc:
        errors += _pydantic_errors(exc, line, "body.", _CHAT_EXPECTED)
    return errors


def check_infer_body(body: dict[str, Any], line: int) -> list[LineError]:
    """Errors of a `/v2/models/{model}/infer` body (KServe v2 token request; empty when valid).

    The model-independent rules of `batchinfer.wire.kserve.parse_infer_request` (structure, types,
    ranges, shape against data, UINT32 ids); the first problem is reported, with `param`
    `body.<path>`. What needs the model (ids below its vocabulary size, the prompt-length limit, the
    input name "input0") is checked by the worker, as a per-line 400 in error.jsonl.
    """
    try:
        parse_infer_request(body)
    except InferError as error:
        code = ErrorCode.MISSING_REQUIRED_PARAMETER if error.missing else ErrorCode.INVALID_PARAMETER
        param = f"body.{error.param}" if error.param else "body"
        return [LineError(code=code, message=f"Line {line}: body: {error.message}", param=param, line=line)]
    return []


def _body_model(match: re.Match[str], body: dict[str, Any]) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) and model else None


def _url_model(match: re.Match[str], body: dict[str, Any]) -> str | None:
    return match["model"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A url this service serves in batches, and how its request lines are checked.

    `template` is the batch's `endpoint` value; `pattern` matches the urls of request lines;
    `check_body(body, line)` returns the body's errors; `model_of(match, body)` finds the model name
    (`None` when absent) and `model_param` is where it comes from, for error messages.
    """

    template: str
    pattern: re.Pattern[str]
    check_body: Callable[[dict[str, Any], int], list[LineError]]
    model_of: Callable[[re.Match[str], dict[str, Any]], str | None]
    model_param: str


ENDPOINTS: dict[str, Endpoint] = {
    e.template: e
    for e in (
        Endpoint(
            CHAT_ENDPOINT, re.compile(re.escape(CHAT_ENDPOINT)), check_chat_body, _body_model, "body.model"
        ),
        Endpoint(
            "/v2/models/{model}/infer",
            re.compile(r"/v2/models/(?P<model>[^/]+)/infer"),
            check_infer_body,
            _url_model,
            "url",
        ),
    )
}
# Endpoints of the OpenAI Batch API that this service does not serve: a line naming one of them is
# in the wrong batch (`url_mismatch`), not a typo (`invalid_url`).
OTHER_OPENAI_URLS = frozenset({"/v1/responses", "/v1/embeddings", "/v1/completions", "/v1/moderations"})


def _find_endpoint(url: str) -> tuple[Endpoint, re.Match[str]] | None:
    for endpoint in ENDPOINTS.values():
        if match := endpoint.pattern.fullmatch(url):
            return endpoint, match
    return None


def _url_hint(url: str) -> str:
    """What to use instead of an unknown url: the fix for a missing slash, or the closest match."""
    known = [*ENDPOINTS, *sorted(OTHER_OPENAI_URLS)]
    if not url.startswith("/") and _find_endpoint("/" + url):
        return f'urls start with "/": use "/{_safe(url)}".'
    if close := difflib.get_close_matches(url, known, n=1, cutoff=0.8):
        return f'did you mean "{close[0]}"?'
    return "known urls: " + ", ".join(f'"{u}"' for u in ENDPOINTS)


# --------------------------------------------------------------------------------------------------
# The file


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (RFC 8259 has no NaN or Infinity)")


# Built once: `json.loads(text, parse_constant=...)` builds a new decoder for every call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
# orjson parses a line ~4x faster than `json`, and whatever it accepts `json` parses to the same
# value, except integers beyond 64 bits (orjson makes them floats): lines with 19 digits in a row
# go to `json`. Whatever orjson rejects (NaN, 1e400, lone surrogates, bad UTF-8, a BOM, ...) also
# goes to `json`, which accepts it or explains the error.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))  # digits to "0", the rest to " "


def _containers(data: bytes) -> int:
    """An upper bound of the nesting depth of the JSON text `data`: its count of `[` and `{` bytes."""
    return data.count(b"[") + data.count(b"{")


_TOO_DEEP = f"it is nested too deeply (more than {MAX_JSON_DEPTH} levels)"


def _has_long_number(data: bytes) -> bool:
    return b"0000000000000000000" in data.translate(_DIGITS_ONLY)


def _plain_envelope(obj: dict[str, Any]) -> bool:
    """True only for a line that `_Envelope` accepts (False says nothing)."""
    method = obj.get("method")
    return (_plain_str(obj.get("custom_id")) and type(method) is str and method == "POST"
            and type(obj.get("url")) is str and type(obj.get("body")) is dict)


assert set(_Envelope.model_fields) == {"custom_id", "method", "url", "body"}


def _foreign_encoding(data: bytes) -> str | None:
    """Why `data` (the first non-blank line) is not UTF-8 text but UTF-16/32, or None."""
    boms = (
        (b"\xff\xfe\x00\x00", "a UTF-32 little-endian byte order mark (FF FE 00 00)"),
        (b"\x00\x00\xfe\xff", "a UTF-32 big-endian byte order mark (00 00 FE FF)"),
        (b"\xff\xfe", "a UTF-16 little-endian byte order mark (FF FE)"),
        (b"\xfe\xff", "a UTF-16 big-endian byte order mark (FE FF)"),
    )
    for bom, name in boms:
        if data.startswith(bom):
            return f"it starts with {name}"
    if b"\x00" in data:
        # ASCII text in UTF-16/32 interleaves NUL bytes; UTF-8 JSON never has a raw NUL.
        return "it has NUL bytes between characters, as UTF-16 or UTF-32 text does"
    return None


def _seen_key(custom_id: str) -> bytes:
    # A 16-byte digest instead of the id bounds the memory of duplicate detection whatever the id
    # lengths; "surrogatepass" keeps the encoding one-to-one for ids with lone surrogates.
    return hashlib.blake2b(custom_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class SeenIds:
    """The `custom_id`s of one file and the line of each, in memory set by `capacity` alone.

    A Bloom filter sized for `capacity` ids (4 MiB per million at a 1e-7 false-positive rate) says
    "certainly new" for almost every id. Every id is also appended as a fixed-size record (16-byte
    digest, 4-byte line) to an anonymous temporary file, and only when the filter says "maybe seen"
    is that file searched, so answers stay exact. Files of a few thousand lines never touch the
    disk; a file of a million lines writes 20 MB to it (Lambda's /tmp holds 512 MB).
    """

    _RECORD = 20
    _FLUSH_BYTES = 64 * 1024 - (64 * 1024) % _RECORD
    _READ_BYTES = 1024 * 1024 - (1024 * 1024) % _RECORD
    FALSE_POSITIVE_RATE = 1e-7

    def __init__(self, capacity: int) -> None:
        self._bloom = Bloom(max(1, capacity), self.FALSE_POSITIVE_RATE)
        self._pending = bytearray()
        self._file: IO[bytes] | None = None
        self._found: dict[bytes, int] = {}  # ids seen twice: their first line (failed files only)

    def first_line(self, custom_id: str, *, exact: bool = True) -> int | None:
        """The line where `custom_id` was added, or None if it never was.

        With `exact=False`, an id the filter only may have seen is reported as seen on line 0 without
        searching (for counting the errors of a file that has already failed many times).
        """
        if custom_id not in self._bloom:
            return None
        key = _seen_key(custom_id)
        if (line := self._found.get(key)) is not None:
            return line
        if not exact:
            return 0
        line = self._search(key)
        if line is not None:
            self._found[key] = line
        return line

    def maybe_seen(self, custom_id: str) -> bool:
        """False when `custom_id` was certainly never added (no search; True says nothing)."""
        return custom_id in self._bloom

    def add(self, custom_id: str, line: int) -> None:
        """Remember that `custom_id` appears on `line` (add each id once, in line order)."""
        self._bloom.add(custom_id)
        self._pending += _seen_key(custom_id) + line.to_bytes(4, "little")
        if len(self._pending) >= self._FLUSH_BYTES:
            self._flush()

    def close(self) -> None:
        """Delete the temporary file (the set answers nothing reliable afterwards)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _flush(self) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="batchinfer-ids-")
        self._file.write(self._pending)
        self._pending.clear()

    def _search(self, key: bytes) -> int | None:
        # Records are in line order: the first aligned match is the first use.
        if self._file is not None:
            self._file.flush()
            self._file.seek(0)
            while block := self._file.read(self._READ_BYTES):
                if (line := self._find(block, key)) is not None:
                    self._file.seek(0, 2)
                    return line
            self._file.seek(0, 2)
        return self._find(self._pending, key)

    @classmethod
    def _find(cls, block: bytes | bytearray, key: bytes) -> int | None:
        at = block.find(key)
        while at >= 0 and at % cls._RECORD:
            at = block.find(key, at + 1)  # the digest's bytes straddling two records, never a match
        if at < 0:
            return None
        return int.from_bytes(block[at + 16 : at + cls._RECORD], "little")


class FileValidator:
    """Validates the lines of one batch input file as they stream by; memory stays bounded.

    Feed every `PhysicalLine` in order to `feed`, then call `finish` once with the file's byte count
    (or use `validate_stream`, which does both). Afterwards `ok` says whether the batch may run,
    `errors` holds the first `max_errors` problems (`error_count` counts all of them),
    `request_count` the non-blank lines (one request each, valid or not) and `model` the file's model
    (from the first line that passed its envelope and url checks).

    Rules (OpenAI Batch API, see the module docstring): one model per file (`model_mismatch`, named
    against the first model), known models only (`model_not_found`), unique `custom_id`s compared
    exactly (case and whitespace matter), every `url` equal to the batch `endpoint` (`url_mismatch`
    for another known endpoint, `invalid_url` for an unknown one). A url without its leading slash
    ("v1/chat/completions") is rejected as `invalid_url` with the fix in the message rather than
    normalised: guessing would accept files that OpenAI rejects. A UTF-16/UTF-32 file fails once
    with `invalid_encoding` at its first non-blank line and the rest is not examined. Limits:
    `max_requests` non-blank lines (`too_many_tasks`), `max_file_bytes` (`file_too_large`),
    `max_line_bytes` per line (`line_too_large`). Memory does not grow with the file: the seen
    `custom_id`s are a `SeenIds` sized by `max_requests`.

    Raises `ValueError` for an `endpoint` that is not in `ENDPOINTS` (a template such as
    "/v2/models/{model}/infer" or a url it matches).
    """

    def __init__(
        self,
        endpoint: str,
        is_known_model: Callable[[str], bool],
        max_requests: int = 50_000,
        max_file_bytes: int = 200 * 1024 * 1024,
        max_line_bytes: int = 1024 * 1024,
        max_errors: int = 1000,
    ) -> None:
        found = ENDPOINTS.get(endpoint) or (_find_endpoint(endpoint) or (None,))[0]
        if found is None:
            raise ValueError(f"unsupported batch endpoint {endpoint!r}; supported: {', '.join(ENDPOINTS)}")
        self.endpoint = endpoint
        self._endpoint = found
        self.is_known_model = is_known_model
        self.max_requests = max_requests
        self.max_file_bytes = max_file_bytes
        self.max_line_bytes = max_line_bytes
        self.max_errors = max_errors

        self.errors: list[LineError] = []
        self.error_count = 0
        self.request_count = 0
        self.model: str | None = None
        self._model_line = 0
        self._model_known: bool | None = None
        self._seen = SeenIds(max_requests)
        self._plain_chat = found.template == CHAT_ENDPOINT  # `_feed_plain` knows chat bodies only
        self._url: str | None = None  # the last url that matched the endpoint, and its match
        self._url_match: re.Match[str] | None = None
        self._last_line = 0
        self._sniffed = False
        self._not_utf8 = False  # the whole file is UTF-16/32: nothing more to say about its lines
        self._finished = False

    @property
    def ok(self) -> bool:
        """True when no problem was found (so far)."""
        return self.error_count == 0

    def _add(self, code: ErrorCode, message: str, param: str | None = None, line: int | None = None) -> None:
        self._add_all([LineError(code=code, message=message, param=param, line=line)])

    def _add_all(self, errors: list[LineError]) -> None:
        self.error_count += len(errors)
        self.errors += errors[: max(0, self.max_errors - len(self.errors))]

    def feed(self, line: PhysicalLine) -> RequestLine | None:
        """Check one physical line; return its request, or None for a blank or bad line.

        Lines must come in order. Whitespace-only lines are blank (JSON whitespace: space, tab, CR;
        RFC 8259 section 2). The problems of a bad line are recorded in `errors`.
        """
        if (request := self._feed_plain(line)) is not None:
            return request
        self._last_line = line.number
        if self._not_utf8:
            return None
        n = line.number
        if line.too_long:
            self._count_request(n, counted=False)
            self._add(
                ErrorCode.LINE_TOO_LARGE,
                f"Line {n} is {line.size} bytes long; the limit is {self.max_line_bytes} bytes per line.",
                line=n,
            )
            return None
        if line.data[:1] != b"{" and not line.data.strip(b" \t\r"):
            return None
        self.request_count += 1
        if self.request_count > self.max_requests:
            self._count_request(n)
        if not self._sniffed:
            self._sniffed = True
            if reason := _foreign_encoding(line.data):
                self._not_utf8 = True
                self._add(
                    ErrorCode.INVALID_ENCODING,
                    f"Line {n}: the file is not UTF-8, {reason}. Save it as UTF-8 JSON Lines.",
                    line=n,
                )
                return None
        obj = self._parse(line)
        if obj is None:
            return None
        custom_id = self._check_envelope(obj, n)
        if custom_id is None:
            return None
        url, body = obj["url"], obj["body"]
        match = self._check_url(url, n)
        if match is None:
            return None
        model = self._endpoint.model_of(match, body)
        if self.model is None and model is not None:
            self.model, self._model_line = model, n
        if errors := self._endpoint.check_body(body, n):
            self._add_all(errors)
            return None
        if model is None:  # a body check that does not require the model (none so far)
            self._add(
                ErrorCode.MISSING_REQUIRED_PARAMETER,
                f"Line {n}: the model is missing ({self._endpoint.model_param}).",
                param=self._endpoint.model_param,
                line=n,
            )
            return None
        if (model != self.model or not self._model_known) and not self._check_model(model, n):
            return None
        return RequestLine(line=n, custom_id=custom_id, method=obj["method"], url=url, body=body, model=model)

    def _feed_plain(self, line: PhysicalLine) -> RequestLine | None:
        """`feed` for the common line, in a fraction of the time: a plain valid chat request with a
        new custom_id, once the file's first request set the model and url. None when the line is
        anything else (nothing was recorded then: `feed` goes on as if this had not run)."""
        data = line.data
        if (not self._plain_chat or self.model is None or not self._model_known or line.too_long
                or self.request_count >= self.max_requests or data[:1] != b"{" or _has_long_number(data)):
            return None
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if type(obj) is not dict or (_containers(data) > MAX_JSON_DEPTH and nested_deeper_than(obj)):
            return None
        get = obj.get
        custom_id, url, body = get("custom_id"), get("url"), get("body")
        # `_plain_envelope`, inline; `url == self._url` makes it a string
        if (type(custom_id) is not str or not custom_id or get("method") != "POST" or url != self._url
                or type(body) is not dict or body.get("model") != self.model
                or self._seen.maybe_seen(custom_id) or not _plain_chat_body(body)):
            return None
        n = self._last_line = line.number
        self.request_count += 1
        self._seen.add(custom_id, n)
        return RequestLine(n, custom_id, "POST", url, body, self.model)

    def _count_request(self, n: int, *, counted: bool = True) -> None:
        if not counted:
            self.request_count += 1
        if self.request_count == self.max_requests + 1:
            self._add(
                ErrorCode.TOO_MANY_TASKS,
                f"The file has more than {self.max_requests} requests, the limit per batch "
                f"(line {n} is request {self.request_count}).",
            )

    def _parse(self, line: PhysicalLine) -> dict[str, Any] | None:
        """The line's JSON object, or None after recording why it is not one."""
        n = line.number
        if not _has_long_number(line.data):
            try:
                obj = orjson.loads(line.data)
            except orjson.JSONDecodeError:
                pass  # the standard parser below says why, as it always has
            else:
                if type(obj) is dict:
                    return obj if self._shallow(obj, line) else None
        try:
            text = line.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = line.data[exc.start]
            self._add(
                ErrorCode.INVALID_ENCODING,
                f"Line {n} is not valid UTF-8: byte 0x{bad:02X} at byte {exc.start} of the line "
                f"({exc.reason}). Batch files must be UTF-8.",
                line=n,
            )
            return None
        if text.startswith("\ufeff"):
            self._add(
                ErrorCode.INVALID_JSON_LINE,
                f"Line {n} starts with a byte order mark (U+FEFF); only the first line of a file may "
                "start with one. Remove it.",
                line=n,
            )
            return None
        try:
            obj = _DECODER.decode(text)
        except json.JSONDecodeError as exc:
            self._add(
                ErrorCode.INVALID_JSON_LINE,
                f"Line {n} is not valid JSON: {exc.msg} at column {exc.colno}.",
                line=n,
            )
            return None
        except (ValueError, RecursionError) as exc:  # NaN/Infinity, huge integers, deep nesting
            reason = _TOO_DEEP if isinstance(exc, RecursionError) else str(exc)
            self._add(ErrorCode.INVALID_JSON_LINE, f"Line {n} is not valid JSON: {reason}.", line=n)
            return None
        if not self._shallow(obj, line):
            return None
        if not isinstance(obj, dict):
            self._add(
                ErrorCode.INVALID_JSON_LINE,
                f"Line {n} is a JSON {_JSON_TYPES[type(obj)]}, not an object; each line must be one "
                'request object {"custom_id": ..., "method": "POST", "url": ..., "body": {...}}.',
                line=n,
            )
            return None
        return obj

    def _shallow(self, obj: Any, line: PhysicalLine) -> bool:
        """False after recording `invalid_json_line` when `obj` nests deeper than `MAX_JSON_DEPTH`
        (checks further down recurse over the value, and would hit Python's recursion limit)."""
        if _containers(line.data) <= MAX_JSON_DEPTH or not nested_deeper_than(obj):
            return True
        n = line.number
        self._add(ErrorCode.INVALID_JSON_LINE, f"Line {n} is not valid JSON: {_TOO_DEEP}.", line=n)
        return False

    def _check_envelope(self, obj: dict[str, Any], n: int) -> str | None:
        """The line's custom_id when the envelope is valid and the id is new, else None (recorded)."""
        errors: list[LineError] = []
        custom_id = obj.get("custom_id")
        if isinstance(custom_id, str) and custom_id:
            # Once the error list is full, a duplicate is only counted: skip the exact search.
            if (first := self._seen.first_line(custom_id, exact=len(self.errors) < self.max_errors)) is not None:
                errors.append(
                    LineError(
                        code=ErrorCode.DUPLICATE_CUSTOM_ID,
                        message=f"custom_id {_quote(custom_id)} on line {n} duplicates line {first}; "
                        "each request needs its own custom_id.",
                        param="custom_id",
                        line=n,
                    )
                )
            elif self.request_count <= self.max_requests:  # past the limit the file fails anyway
                self._seen.add(custom_id, n)
        try:
            if not _plain_envelope(obj):
                _Envelope.model_validate(obj)
        except ValidationError as exc:
            for error in _pydantic_errors(exc, n, "", _ENVELOPE_EXPECTED):
                if (
                    error.param == "body"
                    and "body" not in obj
                    and (other := set(obj) - set(_ENVELOPE_EXPECTED))
                ):
                    keys = ", ".join(_quote(k) for k in sorted(other))
                    error = error.model_copy(
                        update={"message": f"{error.message[:-1]} (the line has {keys})."}
                    )
                errors.append(error)
        if errors:
            self._add_all(errors)
            return None
        return custom_id

    def _check_url(self, url: str, n: int) -> re.Match[str] | None:
        """The url's match against the batch endpoint, or None after recording the mismatch."""
        if url == self._url:  # every line of a batch has the same url
            return self._url_match
        found = _find_endpoint(url)
        if found is not None and found[0] is self._endpoint:
            self._url, self._url_match = url, found[1]
            return found[1]
        if found is not None or url in OTHER_OPENAI_URLS:
            self._add(
                ErrorCode.URL_MISMATCH,
                f"Line {n}: url {_quote(url)} does not match the batch endpoint {_quote(self.endpoint)}; "
                "all requests of a batch go to its endpoint.",
                param="url",
                line=n,
            )
        else:
            self._add(
                ErrorCode.INVALID_URL,
                f"Line {n}: url {_quote(url)} is not a known endpoint; {_url_hint(url)}",
                param="url",
                line=n,
            )
        return None

    def _check_model(self, model: str, n: int) -> bool:
        """True when `model` is the file's model and is served, else False (recorded)."""
        param = self._endpoint.model_param
        if model != self.model:
            self._add(
                ErrorCode.MODEL_MISMATCH,
                f"Line {n}: model {_quote(model)} differs from model {_quote(self.model or '')} of line "
                f"{self._model_line}; a batch file must use one model.",
                param=param,
                line=n,
            )
            return False
        if self._model_known is None:
            self._model_known = self.is_known_model(model)
        if not self._model_known:
            self._add(
                ErrorCode.MODEL_NOT_FOUND,
                f"Line {n}: model {_quote(model)} is not served by this deployment.",
                param=param,
                line=n,
            )
            return False
        return True

    def finish(self, total_bytes: int) -> None:
        """Add the file-level errors once all lines were fed: `file_too_large` when `total_bytes`
        (the file's size, or the bytes read before stopping) exceeds `max_file_bytes`, and
        `empty_file` when no line had content. Calling it again does nothing."""
        if self._finished:
            return
        self._finished = True
        self._seen.close()
        if total_bytes > self.max_file_bytes:
            self._add(
                ErrorCode.FILE_TOO_LARGE,
                f"The file is larger than the limit of {self.max_file_bytes} bytes "
                f"({total_bytes} bytes read).",
            )
        elif self.request_count == 0:
            if self._last_line == 0:
                what = f"it is empty ({total_bytes} bytes)"
            elif self._last_line == 1:
                what = "its only line is blank"
            else:
                what = f"its {self._last_line} lines are all blank"
            self._add(ErrorCode.EMPTY_FILE, f"The file has no requests: {what}.")

    def validate_stream(self, chunks: Iterable[bytes]) -> Iterator[RequestLine]:
        """Split, check and yield the valid requests of a chunked file, then call `finish`.

        Reading stops early once more than `max_file_bytes` were read. The batch may run only if
        `ok` is True after the iterator is exhausted.
        """
        lines = iter_physical_lines(chunks, self.max_line_bytes, max_total_bytes=self.max_file_bytes)
        for line in lines:
            if (request := self.feed(line)) is not None:
                yield request
        self.finish(lines.bytes_read)
