"""The token inference contract: `POST /v2/models/{model}/infer`, KServe v2 shape, MindIE semantics.

Sources of the rules below:
- KServe v2 (Open Inference Protocol), HTTP/REST:
  https://kserve.github.io/website/docs/concepts/architecture/data-plane/v2-protocol
  (request `{id?, inputs, outputs?, parameters?}`, response `{id, outputs}`, a failed request is
  answered with `{"error": "<message>"}`).
- MindIE Service, token inference interface ("Token推理接口"):
  https://www.hiascend.com/document/detail/zh/mindie/22RC1/mindiellm/llmdev/mindie_service0084.html
  (one input named `input0` of datatype UINT32 holding token ids, shape `[1, n]`; the sampling
  parameters and their ranges; `/versions/{v}` is not supported). Its prompt-length limit is
  min(maxInputTokenLen, maxSeqLen - 1, max_position_embeddings, 1M tokens).

Range notation: `(a, b]` excludes `a` and includes `b`. Every field is strictly typed: `true` is not
an integer, `3.0` is not a token id, `"7"` is not a number. A JSON `null` means "not given".

Example::

    request = parse_infer_request(load_json(raw), limits)       # raises InferError(400, ...)
    result = await backend.generate_tokens(request.input_ids, request.params)
    body = infer_response(request, result)                      # {"id", "outputs": [...]}
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from batchinfer.wire import strict_json
from batchinfer.wire.messages import describe, loc_path
from batchinfer.wire.rules import Words, rules
from batchinfer.wire.strict_json import JsonErrorKind
from batchinfer.wire.tokens import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TIMEOUT_S,
    PROMPT_TOKENS_CAP,
    ModelLimits,
    SamplingParams,
    TokenRequest,
    TokenResult,
)

__all__ = [
    "DATATYPE",
    "INPUT_NAME",
    "InferError",
    "InferRequestBody",
    "InferResponse",
    "InferResponseOutput",
    "ModelLimits",
    "SamplingParams",
    "TokenRequest",
    "TokenResult",
    "infer_response",
    "load_json",
    "parse_infer_request",
]

UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1
INPUT_NAME = "input0"  # MindIE: the one input is named "input0"
OUTPUT_NAME = "output0"
DATATYPE = "UINT32"
MIN_TEMPERATURE = 1e-6
MIN_TOP_P = 1e-6
MAX_TIMEOUT_S = 3600
MAX_NAME_CHARS = 256


class InferError(Exception):
    """A token request that cannot be served: HTTP `status` (400 bad request, 404 unknown model,
    504 timeout, 5xx backend failure) and a `message` naming the field and the allowed range.

    `param` is the field's path (`parameters.top_k`, `inputs[0].data[3]`) when one is at fault;
    `missing` says the field is required and absent; `headers` go with the HTTP answer
    (`WWW-Authenticate` on a 401, `Retry-After` on a 429).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        missing: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.missing = missing
        self.headers = headers or {}

    def body(self) -> dict[str, str]:
        """The KServe v2 error body `{"error": message}`."""
        return {"error": self.message}


# --------------------------------------------------------------------------------------------------
# Wire models (structure and ranges that do not depend on the model)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)]
RequestId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_NAME_CHARS, pattern=r"^[A-Za-z0-9_-]+$"),
    Words("{rule}, each one of A-Z, a-z, 0-9, '_' and '-'"),
]
Uint32 = Annotated[int, Field(ge=0, le=UINT32_MAX), Words(f"a {DATATYPE} token id, {{rule}}")]


class InferInput(_Strict):
    """One input tensor: `name`, `shape` `[n]` or `[1, n]`, `datatype` "UINT32", `data` token ids.
    The shape against the data and the name "input0" are checked after parsing (`parse_infer_request`)."""

    name: Annotated[Name, Words(f'{{rule}}, "{INPUT_NAME}"')]
    shape: Annotated[list[int], Words("[n] or [1, n], where n is the number of token ids in data")]
    datatype: Annotated[Literal["UINT32"], Words("{rule} (token ids)")]
    data: Annotated[list[Uint32], Words("{rule} of token ids")]
    parameters: dict[str, Any] | None = None  # KServe allows per-tensor parameters; none are used


class InferOutput(_Strict):
    """One requested output; its `name` is echoed in the response."""

    name: Name
    parameters: dict[str, Any] | None = None


class InferParameters(_Strict):
    """The sampling and scheduling parameters (MindIE token inference interface); all optional."""

    temperature: Annotated[float, Field(gt=MIN_TEMPERATURE, allow_inf_nan=False)] | None = None
    top_k: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    top_p: Annotated[float, Field(gt=MIN_TOP_P, le=1.0, allow_inf_nan=False)] | None = None
    do_sample: bool | None = None
    seed: Annotated[int, Field(gt=0, le=UINT64_MAX), Words("{rule} or null")] | None = None
    repetition_penalty: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    max_new_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    # Accepted for compatibility, not supported: no watermark is applied to the generated tokens.
    watermark: bool | None = None
    # Accepted and ignored (MindIE clients send them; they change nothing here).
    details: Any = None
    batch_size: Any = None
    priority: Annotated[int, Field(ge=1, le=5)] | None = None
    timeout: (
        Annotated[int, Field(gt=0, le=MAX_TIMEOUT_S), Words("an integer number of seconds in {interval}")]
        | None
    ) = None

    def sampling(self, limits: ModelLimits) -> SamplingParams:
        """The resolved parameters: those given (null is not given), the model's `default_top_k`, and
        `SamplingParams`' defaults (MindIE's) for the rest; sampling is on when temperature, top_k or
        top_p is given (else greedy). A top_k at or above `limits.vocab_size` means all of it, and
        `limits.max_iter_times` caps max_new_tokens (MindIE)."""
        given = self.model_dump(include=_SAMPLING_FIELDS, exclude_none=True)
        given.setdefault("do_sample", bool({"temperature", "top_k", "top_p"} & set(given)))
        given.setdefault("top_k", limits.default_top_k)
        if limits.vocab_size is not None:
            given["top_k"] = min(given["top_k"], limits.vocab_size)
        if limits.max_iter_times is not None:
            given["max_new_tokens"] = min(
                given.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS), limits.max_iter_times
            )
        timeout = float(given.pop("timeout", DEFAULT_TIMEOUT_S))
        return SamplingParams(**given, timeout=timeout)


# The parameters that `InferParameters.sampling` takes as given.
_SAMPLING_FIELDS = frozenset(
    {
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "repetition_penalty",
        "max_new_tokens",
        "priority",
        "timeout",
    }
)


class InferRequestBody(_Strict):
    """A token inference request body; unknown fields are rejected at every level."""

    id: RequestId | None = None
    inputs: Annotated[list[InferInput], Field(min_length=1, max_length=1), Words("{rule} input tensor")]
    outputs: Annotated[
        list[InferOutput], Field(min_length=1, max_length=1), Words("{rule} output, as many as inputs")
    ]
    parameters: InferParameters | None = None


# What each field must be, for messages (from the models: `wire.rules`); the key is the path with
# indices elided (`inputs[].name`).
RULES: dict[str, str] = {"": "a JSON object", **rules(InferRequestBody)}
_FIELDS: dict[str, type[BaseModel]] = {
    "": InferRequestBody,
    "inputs[]": InferInput,
    "outputs[]": InferOutput,
    "parameters": InferParameters,
}


# --------------------------------------------------------------------------------------------------
# Parsing


class _NonFinite:
    """Stands for a NaN/Infinity literal while parsing, so the message can name where it was."""

    def __init__(self, literal: str) -> None:
        self.literal = literal


def load_json(raw: str | bytes) -> Any:
    """Parse a request body (`strict_json.loads`). NaN and Infinity literals (not JSON, RFC 8259 §6)
    parse into markers that `parse_infer_request` rejects with the field named. Raises
    `InferError(400)` for invalid JSON, bytes that are not UTF-8 and values nested deeper than
    `MAX_JSON_DEPTH` levels."""
    try:
        return strict_json.loads(raw, non_finite=_NonFinite)
    except strict_json.JsonError as error:
        if error.kind is JsonErrorKind.TOO_DEEP:
            raise InferError(400, f"the request body is {error.msg}") from None
        raise InferError(400, f"the request body is not valid JSON: {error}") from None


def _rule_key(path: str) -> str:
    return re.sub(r"\[\d+\]", "[]", path)


def _describe(value: Any) -> str:
    """`messages.describe`, and a NaN/Infinity marker as what it stands for."""
    if isinstance(value, _NonFinite):
        return f"{value.literal} (not a JSON number)"
    return describe(value)


def _find_non_finite(
    value: Any, loc: tuple[int | str, ...] = ()
) -> tuple[tuple[int | str, ...], _NonFinite] | None:
    if isinstance(value, _NonFinite):
        return loc, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if (found := _find_non_finite(item, (*loc, key))) is not None:
            return found
    return None


def _message(error: Any) -> tuple[str, str]:
    """(message, path) for a pydantic error of a request body."""
    loc = tuple(error["loc"])
    path = loc_path(loc)
    key = _rule_key(path)
    rule = RULES.get(key)
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = _FIELDS.get(_rule_key(loc_path(loc[:-1])), InferRequestBody)
        allowed = ", ".join(parent.model_fields)
        where = f" in {loc_path(loc[:-1])}" if loc[:-1] else ""
        return f"unknown field {path}{where}: the allowed fields are {allowed}", path
    if kind == "missing":
        return f"{path} is required: it must be {rule}", path
    if kind in ("too_short", "too_long") and isinstance(error.get("input"), list):
        count = len(error["input"])
        return f"{path} must be {rule}, got {count} element{'s' if count != 1 else ''}", path
    return f"{path} must be {rule or error['msg']}, got {_describe(error.get('input'))}", path


def parse_infer_request(body: Any, limits: ModelLimits | None = None) -> TokenRequest:
    """Check a parsed request body and resolve its defaults.

    With `limits` None only the model-independent rules are checked (a batch line before any model
    is loaded): structure, types, ranges, the input name "input0", shape against data, ids within
    UINT32, 0 < n <= 1024*1024. With `limits`, also: ids are in [0, vocab_size), n is at most
    `limits.max_prompt_tokens`, top_k >= vocab_size means vocab_size, and max_new_tokens is capped by
    max_iter_times.

    Defaults (MindIE): temperature 1.0, top_k the model's generation config else 1000, top_p 1.0,
    do_sample on when temperature, top_k or top_p is given (else greedy), repetition_penalty 1.0,
    max_new_tokens 20, priority 5, timeout 600 s, a random seed, a generated id.

    Raises `InferError(400, message, param=path)`; the message names the field and what it must be.
    """
    parsed = _validated(body)
    tensor = parsed.inputs[0]
    _check_shape(tensor.shape, len(tensor.data))
    _check_tokens(tensor, limits)
    params = (parsed.parameters or InferParameters()).sampling(limits or ModelLimits())
    request_id = parsed.id if parsed.id is not None else uuid.uuid4().hex
    return TokenRequest(
        id=request_id, input_ids=list(tensor.data), output_name=parsed.outputs[0].name, params=params
    )


def _validated(body: Any) -> InferRequestBody:
    """`body` as an `InferRequestBody`; raises `InferError(400)` naming the first problem (a NaN or
    Infinity literal first, wherever it is)."""
    if not isinstance(body, dict):
        raise InferError(400, f"the request body must be a JSON object, got {_describe(body)}")
    if (found := _find_non_finite(body)) is not None:
        loc, marker = found
        path = loc_path(loc)
        rule = RULES.get(_rule_key(path), "a finite number")
        raise InferError(
            400,
            f"{path} must be {rule}, got {marker.literal}, which is not a JSON number "
            "(RFC 8259 has no NaN or Infinity)",
            param=path,
        )
    try:
        return InferRequestBody.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        message, path = _message(first)
        raise InferError(400, message, param=path, missing=first["type"] == "missing") from None


def _check_tokens(tensor: InferInput, limits: ModelLimits | None) -> None:
    """The prompt's length (at most the model's limit, else the 1M cap), the input's name, and with
    `limits` each id within the vocabulary; raises `InferError(400)`."""
    n = len(tensor.data)
    max_n = limits.max_prompt_tokens if limits is not None else PROMPT_TOKENS_CAP
    if not 0 < n <= max_n:
        where = f" ({limits.describe_prompt_limit()})" if limits is not None else ""
        raise InferError(
            400,
            f"inputs[0].data must hold n token ids with n in (0, {max_n}]{where}, got {n}",
            param="inputs[0].data",
        )
    if tensor.name != INPUT_NAME:
        raise InferError(
            400,
            f'inputs[0].name must be "{INPUT_NAME}" (MindIE\'s one token input), '
            f"got {_describe(tensor.name)}",
            param="inputs[0].name",
        )
    if limits is not None and limits.vocab_size is not None:
        for index, token in enumerate(tensor.data):
            if token >= limits.vocab_size:
                raise InferError(
                    400,
                    f"inputs[0].data[{index}] must be a token id of the model's vocabulary, "
                    f"an integer in [0, {limits.vocab_size}), got integer {token}",
                    param=f"inputs[0].data[{index}]",
                )


def _check_shape(shape: list[int], n: int) -> None:
    shown = json.dumps(shape)
    if len(shape) not in (1, 2):
        raise InferError(
            400,
            f"inputs[0].shape must be {RULES['inputs[].shape']}, got {shown} ({len(shape)} dimensions)",
            param="inputs[0].shape",
        )
    if len(shape) == 2 and shape[0] != 1:
        raise InferError(
            400,
            f"inputs[0].shape[0] must be 1 (one sequence per request; shape [1, n]), got {shape[0]}",
            param="inputs[0].shape[0]",
        )
    dim = len(shape) - 1
    if shape[dim] <= 0 < n:
        raise InferError(
            400,
            f"inputs[0].shape[{dim}] must be a positive integer, the number of token ids in "
            f"inputs[0].data ({n}), got {shape[dim]}",
            param=f"inputs[0].shape[{dim}]",
        )
    if shape[dim] != n:
        raise InferError(
            400,
            f"inputs[0].shape[{dim}] must equal the number of token ids in inputs[0].data: "
            f"{shape[dim]} expected by shape {shown}, {n} given",
            param=f"inputs[0].shape[{dim}]",
        )


class InferResponseOutput(BaseModel):
    """One output tensor of a response: its `name`, `shape` `[1, n]`, `datatype` "UINT32", `data`."""

    name: str
    shape: list[int]
    datatype: Literal["UINT32"] = DATATYPE
    data: list[int]


class InferResponse(BaseModel):
    """A token inference response body `{"id", "outputs": [...]}` (`model_dump()` is its JSON)."""

    id: str
    outputs: list[InferResponseOutput]


def infer_response(request: TokenRequest, result: TokenResult) -> dict[str, Any]:
    """The response body: `{"id", "outputs": [{"name", "shape": [1, n], "datatype": "UINT32", "data"}]}`
    with the generated ids only (n of them; the prompt is not repeated)."""
    output = InferResponseOutput(name=request.output_name, shape=[1, len(result.ids)], data=result.ids)
    return InferResponse(id=request.id, outputs=[output]).model_dump()


def token_request_body(request_id: str, input_ids: list[int], params: SamplingParams) -> dict[str, Any]:
    """A complete request body for `input_ids` with every parameter explicit (what a client sends)."""
    return {
        "id": request_id,
        "inputs": [
            {"name": INPUT_NAME, "shape": [1, len(input_ids)], "datatype": DATATYPE, "data": input_ids}
        ],
        "outputs": [{"name": OUTPUT_NAME}],
        "parameters": params.as_parameters(),
    }
