"""Validation of a batch input file, line by line, as the `prepare` step streams it.

The file format and error codes follow the OpenAI Batch API
(https://platform.openai.com/docs/api-reference/batch/request-input and the `errors.data[]` entries
of the Batch object): every non-blank line is `{"custom_id", "method": "POST", "url", "body"}`.
Problems are reported as `LineError`s `{code, message, param, line}` (`wire.line_errors`), where
`line` is the 1-based physical line (blank lines count) and `param` the dotted path of the offending
field.

What is checked here, and what is not:
- Checked: UTF-8, JSON (`wire.strict_json`), the request envelope, unique `custom_id`s
  (`validation.seen_ids`), the url and the request body of the endpoint (`batchinfer.endpoints`),
  one known model per file, and the file limits.
- Not checked (the worker answers these per line at run time, without failing the file): a prompt
  longer than the model's context, lone surrogate escapes (`"\\ud800"`) and NUL characters
  (`"\\u0000"`) inside strings. They are valid JSON, and one such line must not fail a whole batch.

Each line is checked in stages (encoding, JSON, envelope, url, body, model); every problem of the
first failing stage is reported and the later stages are skipped for that line, so one mistake
(say a missing `body`) does not cascade into several errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, NamedTuple

import orjson

from batchinfer.endpoints.registry import OTHER_OPENAI_URLS, endpoint_for, find_endpoint, url_hint
from batchinfer.validation.envelope import envelope_errors, plain_envelope
from batchinfer.validation.jsonl import PhysicalLine, iter_physical_lines
from batchinfer.validation.seen_ids import SeenIds
from batchinfer.validation.sniff import (
    TOO_DEEP,
    containers,
    foreign_encoding,
    has_long_number,
    json_reason,
    jsonl_format_problem,
    starts_array_of_objects,
)
from batchinfer.wire import strict_json
from batchinfer.wire.line_errors import ErrorCode, LineError
from batchinfer.wire.messages import json_type, quote, unknown_model
from batchinfer.wire.strict_json import MAX_JSON_DEPTH, JsonError, nested_deeper_than

__all__ = ["ErrorCode", "FileValidator", "LineError", "RequestLine", "jsonl_format_problem"]


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
# The file


class FileValidator:
    """Validates the lines of one batch input file as they stream by; memory stays bounded.

    Feed every `PhysicalLine` in order to `feed`, then call `finish` once with the file's byte count
    (or use `validate_stream`, which does both). Afterwards `ok` says whether the batch may run,
    `errors` holds the first problems, at most `max_errors` of them and `max_error_bytes` of their JSON
    (`error_count` counts all of them),
    `request_count` the non-blank lines (one request each, valid or not) and `model` the file's model
    (from the first line that passed its envelope and url checks).

    Rules (OpenAI Batch API, see the module docstring): one model per file (`model_mismatch`, named
    against the first model), known models only (`model_not_found`, naming the closest of
    `model_names`), models whose backend serves the endpoint (`endpoint_not_supported`, naming the
    models of `model_names` that do; `serves` gives a model's endpoint templates, None: all), unique
    `custom_id`s compared exactly (case and whitespace matter), every `url` equal to the batch
    `endpoint` (`url_mismatch` for another known endpoint, `invalid_url` for an unknown one). A url
    without its leading slash ("v1/chat/completions") is rejected as `invalid_url` with the fix in
    the message rather than normalised: guessing would accept files that OpenAI rejects. A
    UTF-16/UTF-32 file fails once with `invalid_encoding` at its first non-blank line and the rest
    is not examined; so does a file whose first non-blank line starts a JSON array
    (`invalid_json_line`, with the JSON Lines hint). Limits:
    `max_requests` non-blank lines (`too_many_tasks`), `max_file_bytes` (`file_too_large`),
    `max_line_bytes` per line (`line_too_large`). Memory does not grow with the file: the seen
    `custom_id`s are a `SeenIds` sized by `max_requests`.

    Raises `ValueError` for an `endpoint` that is not served (`batchinfer.endpoints.registry`: a
    template such as "/v2/models/{model}/infer" or a url it matches).
    """

    def __init__(
        self,
        endpoint: str,
        is_known_model: Callable[[str], bool],
        max_requests: int = 50_000,
        max_file_bytes: int = 200 * 1024 * 1024,
        max_line_bytes: int = 1024 * 1024,
        max_errors: int = 1000,
        model_names: Iterable[str] = (),
        max_error_bytes: int = 100 * 1024,
        serves: Callable[[str], Collection[str]] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._endpoint = found = endpoint_for(endpoint)
        self.is_known_model = is_known_model
        self.serves = serves
        self.model_names = list(model_names)
        self.max_requests = max_requests
        self.max_file_bytes = max_file_bytes
        self.max_line_bytes = max_line_bytes
        self.max_errors = max_errors
        self.max_error_bytes = max_error_bytes

        self.errors: list[LineError] = []
        self.error_count = 0
        self._error_bytes = 2  # of `json.dumps(errors)`: the brackets, then each error and its ", "
        self.request_count = 0
        self.input_count = 0  # of the valid bodies, toward the endpoint's `max_batch_inputs`
        self.model: str | None = None
        self._model_line = 0
        self._model_found = False  # the registry lists the file's model
        self._model_known: bool | None = None  # ... and it serves the endpoint
        self._seen = SeenIds(max_requests)
        self._plain_body = found.plain_body  # `_feed_plain` needs the endpoint's fast body check
        self._url: str | None = None  # the last url that matched the endpoint, and its match
        self._url_match: re.Match[str] | None = None
        self._last_line = 0
        self._sniffed = False
        self._not_utf8 = False  # the whole file is UTF-16/32: nothing more to say about its lines
        self._not_jsonl = False  # the file is a JSON array: one error says so, not one per line
        self._finished = False

    @property
    def ok(self) -> bool:
        """True when no problem was found (so far)."""
        return self.error_count == 0

    def _add(self, code: ErrorCode, message: str, param: str | None = None, line: int | None = None) -> None:
        self._add_all([LineError(code=code, message=message, param=param, line=line)])

    def _add_all(self, errors: list[LineError]) -> None:
        self.error_count += len(errors)
        for error in errors:
            if len(self.errors) >= self.max_errors or self._error_bytes >= self.max_error_bytes:
                return
            size = len(json.dumps(error.model_dump())) + 2
            if self._error_bytes + size > self.max_error_bytes:
                self._error_bytes = self.max_error_bytes  # full: later (shorter) errors would be out of order
                return
            self._error_bytes += size
            self.errors.append(error)

    def feed(self, line: PhysicalLine) -> RequestLine | None:
        """Check one physical line; return its request, or None for a blank or bad line.

        Lines must come in order. Whitespace-only lines are blank (JSON whitespace: space, tab, CR;
        RFC 8259 section 2). The problems of a bad line are recorded in `errors`.
        """
        if (request := self._feed_plain(line)) is not None:
            return request
        self._last_line = line.number
        if self._not_utf8 or self._not_jsonl:
            return None
        n = line.number
        if line.too_long:
            self._line_too_long(n, line.size)
            return None
        if line.data[:1] != b"{" and not line.data.strip(b" \t\r"):
            return None
        self.request_count += 1
        if self.request_count > self.max_requests:
            self._count_request(n)
        if not self._sniffed and not self._sniff(line):
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
        self.input_count += self._endpoint.inputs(body)
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

    def _line_too_long(self, n: int, size: int) -> None:
        self._count_request(n, counted=False)
        self._add(
            ErrorCode.LINE_TOO_LARGE,
            f"Line {n} is {size} bytes long; the limit is {self.max_line_bytes} bytes per line.",
            line=n,
        )

    def _sniff(self, line: PhysicalLine) -> bool:
        """Whether the file's first non-blank `line` may start JSON Lines; False after recording why
        not (UTF-16/32, or a JSON array): its later lines are then not examined."""
        self._sniffed = True
        n = line.number
        if reason := foreign_encoding(line.data):
            self._not_utf8 = True
            self._add(
                ErrorCode.INVALID_ENCODING,
                f"Line {n}: the file is not UTF-8, {reason}. Save it as UTF-8 JSON Lines.",
                line=n,
            )
            return False
        if starts_array_of_objects(line.data):
            self._not_jsonl = True
            self._add(
                ErrorCode.INVALID_JSON_LINE,
                f"Line {n} starts a JSON array: this must be JSON Lines (one request object per "
                "line), not a JSON array. Write each request object on a line of its own, without "
                "[ ] or commas.",
                line=n,
            )
            return False
        return True

    def _feed_plain(self, line: PhysicalLine) -> RequestLine | None:
        """`feed` for the common line, in a fraction of the time: a request with a new custom_id whose
        body passes the endpoint's `plain_body` check, once the file's first request set the model and
        url. None when the line is anything else (nothing was recorded then: `feed` goes on as if this
        had not run)."""
        data = line.data
        if (
            self._plain_body is None
            or self.model is None
            or not self._model_known
            or line.too_long
            or self.request_count >= self.max_requests
            or data[:1] != b"{"
            or has_long_number(data)
        ):
            return None
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if type(obj) is not dict or (containers(data) > MAX_JSON_DEPTH and nested_deeper_than(obj)):
            return None
        get = obj.get
        custom_id, url, body = get("custom_id"), get("url"), get("body")
        # `plain_envelope`, inline; `url == self._url` makes it a string
        if (
            type(custom_id) is not str
            or not custom_id
            or get("method") != "POST"
            or url != self._url
            or type(body) is not dict
            or self._endpoint.model_of(self._url_match, body) != self.model  # type: ignore[arg-type]
            or self._seen.maybe_seen(custom_id)
            or not self._plain_body(body)
        ):
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
        if not has_long_number(line.data):
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
            obj = strict_json.loads(text)
        except JsonError as exc:
            self._add(ErrorCode.INVALID_JSON_LINE, f"Line {n} is not valid JSON: {json_reason(exc)}.", line=n)
            return None
        if not isinstance(obj, dict):
            self._add(
                ErrorCode.INVALID_JSON_LINE,
                f"Line {n} is a JSON {json_type(obj)}, not an object; each line must be one "
                'request object {"custom_id": ..., "method": "POST", "url": ..., "body": {...}}.',
                line=n,
            )
            return None
        return obj

    def _shallow(self, obj: Any, line: PhysicalLine) -> bool:
        """False after recording `invalid_json_line` when `obj` nests deeper than `MAX_JSON_DEPTH`
        (checks further down recurse over the value, and would hit Python's recursion limit)."""
        if containers(line.data) <= MAX_JSON_DEPTH or not nested_deeper_than(obj):
            return True
        n = line.number
        self._add(ErrorCode.INVALID_JSON_LINE, f"Line {n} is not valid JSON: {TOO_DEEP}.", line=n)
        return False

    def _check_envelope(self, obj: dict[str, Any], n: int) -> str | None:
        """The line's custom_id when the envelope is valid and the id is new, else None (recorded)."""
        errors: list[LineError] = []
        custom_id = obj.get("custom_id")
        if isinstance(custom_id, str) and custom_id:
            # Once the error list is full, a duplicate is only counted: skip the exact search.
            if (
                first := self._seen.first_line(custom_id, exact=len(self.errors) < self.max_errors)
            ) is not None:
                errors.append(
                    LineError(
                        code=ErrorCode.DUPLICATE_CUSTOM_ID,
                        message=f"custom_id {quote(custom_id)} on line {n} duplicates line {first}; "
                        "each request needs its own custom_id.",
                        param="custom_id",
                        line=n,
                    )
                )
            elif self.request_count <= self.max_requests:  # past the limit the file fails anyway
                self._seen.add(custom_id, n)
        if not plain_envelope(obj):
            errors += envelope_errors(obj, n)
        if errors:
            self._add_all(errors)
            return None
        return custom_id

    def _check_url(self, url: str, n: int) -> re.Match[str] | None:
        """The url's match against the batch endpoint, or None after recording the mismatch."""
        if url == self._url:  # every line of a batch has the same url
            return self._url_match
        found = find_endpoint(url)
        if found is not None and found[0] is self._endpoint:
            self._url, self._url_match = url, found[1]
            return found[1]
        if found is not None or url in OTHER_OPENAI_URLS:
            self._add(
                ErrorCode.URL_MISMATCH,
                f"Line {n}: url {quote(url)} does not match the batch endpoint {quote(self.endpoint)}; "
                "all requests of a batch go to its endpoint.",
                param="url",
                line=n,
            )
        else:
            self._add(
                ErrorCode.INVALID_URL,
                f"Line {n}: url {quote(url)} is not a known endpoint; {url_hint(url)}",
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
                f"Line {n}: model {quote(model)} differs from model {quote(self.model or '')} of line "
                f"{self._model_line}; a batch file must use one model.",
                param=param,
                line=n,
            )
            return False
        if self._model_known is None:
            self._model_found = self.is_known_model(model)
            self._model_known = self._model_found and self._served_by(model)
        if not self._model_known:
            if not self._model_found:
                self._add(
                    ErrorCode.MODEL_NOT_FOUND,
                    f"Line {n}: {unknown_model(model, self.model_names)}",
                    param=param,
                    line=n,
                )
            else:
                self._not_served(model, n)
            return False
        return True

    def _served_by(self, model: str) -> bool:
        """Whether `model`'s backend serves the batch's endpoint (True without `serves`)."""
        return self.serves is None or self._endpoint.served_by(frozenset(self.serves(model)))

    def _not_served(self, model: str, n: int) -> None:
        """Record `endpoint_not_supported` for `model` on line `n`, naming the models that serve it."""
        able = [quote(name) for name in self.model_names if self._served_by(name)]
        which = f"models that do: {', '.join(able)}" if able else "no model of this deployment does"
        self._add(
            ErrorCode.ENDPOINT_NOT_SUPPORTED,
            f"Line {n}: model {quote(model)} does not serve {self._endpoint.template}; {which}.",
            param=self._endpoint.model_param,
            line=n,
        )

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
        limit = self._endpoint.max_batch_inputs
        if limit is not None and self.input_count > limit:
            self._add(
                ErrorCode.TOO_MANY_TASKS,
                f"The batch has {self.input_count} inputs; the limit is {limit} inputs per batch.",
            )

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
