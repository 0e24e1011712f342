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
import math
import re
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from batchinfer.wire import strict_json
from batchinfer.wire.messages import describe, loc_path
from batchinfer.wire.strict_json import JsonErrorKind

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
# MindIE: a prompt never exceeds 1M tokens, whatever the configuration says.
PROMPT_TOKENS_CAP = 1024 * 1024
INPUT_NAME = "input0"  # MindIE: the one input is named "input0"
OUTPUT_NAME = "output0"
DATATYPE = "UINT32"
MIN_TEMPERATURE = 1e-6
MIN_TOP_P = 1e-6
DEFAULT_TOP_K = 1000  # when the model's generation config has none
DEFAULT_MAX_NEW_TOKENS = 20
DEFAULT_PRIORITY = 5
DEFAULT_TIMEOUT_S = 600
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
    str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS, pattern=r"^[A-Za-z0-9_-]+$")
]
Uint32 = Annotated[int, Field(ge=0, le=UINT32_MAX)]


class InferInput(_Strict):
    """One input tensor: `name`, `shape` `[n]` or `[1, n]`, `datatype` "UINT32", `data` token ids."""

    name: Name
    shape: list[int]
    datatype: Literal["UINT32"]
    data: list[Uint32]
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
    seed: Annotated[int, Field(gt=0, le=UINT64_MAX)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] | None = None
    max_new_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    # Accepted for compatibility, not supported: no watermark is applied to the generated tokens.
    watermark: bool | None = None
    # Accepted and ignored (MindIE clients send them; they change nothing here).
    details: Any = None
    batch_size: Any = None
    priority: Annotated[int, Field(ge=1, le=5)] | None = None
    timeout: Annotated[int, Field(gt=0, le=MAX_TIMEOUT_S)] | None = None


class InferRequestBody(_Strict):
    """A token inference request body; unknown fields are rejected at every level."""

    id: RequestId | None = None
    inputs: Annotated[list[InferInput], Field(min_length=1, max_length=1)]
    outputs: Annotated[list[InferOutput], Field(min_length=1, max_length=1)]
    parameters: InferParameters | None = None


# What each field must be, for messages: the key is the path with indices elided (`inputs[].name`).
RULES: dict[str, str] = {
    "": "a JSON object",
    "id": f"a string of 1 to {MAX_NAME_CHARS} characters, each one of A-Z, a-z, 0-9, '_' and '-'",
    "inputs": "an array of exactly 1 input tensor",
    "inputs[]": "an object with name, shape, datatype and data",
    "inputs[].name": f'a string of 1 to {MAX_NAME_CHARS} characters, "{INPUT_NAME}"',
    "inputs[].shape": "[n] or [1, n], where n is the number of token ids in data",
    "inputs[].shape[]": "an integer",
    "inputs[].datatype": f'"{DATATYPE}" (token ids)',
    "inputs[].data": "an array of token ids",
    "inputs[].data[]": f"a {DATATYPE} token id, an integer in [0, {UINT32_MAX}]",
    "inputs[].parameters": "an object",
    "outputs": "an array of exactly 1 output, as many as inputs",
    "outputs[]": "an object with a name",
    "outputs[].name": f"a string of 1 to {MAX_NAME_CHARS} characters",
    "outputs[].parameters": "an object",
    "parameters": "an object",
    "parameters.temperature": f"a number greater than {MIN_TEMPERATURE:g}",
    "parameters.top_k": f"an integer in (0, {INT32_MAX}]",
    "parameters.top_p": f"a number in ({MIN_TOP_P:g}, 1.0]",
    "parameters.do_sample": "a boolean",
    "parameters.seed": f"an integer in (0, {UINT64_MAX}] or null",
    "parameters.repetition_penalty": "a number greater than 0",
    "parameters.max_new_tokens": f"an integer in (0, {INT32_MAX}]",
    "parameters.watermark": "a boolean",
    "parameters.priority": "an integer in [1, 5]",
    "parameters.timeout": f"an integer number of seconds in (0, {MAX_TIMEOUT_S}]",
}
_FIELDS: dict[str, type[BaseModel]] = {
    "": InferRequestBody,
    "inputs[]": InferInput,
    "outputs[]": InferOutput,
    "parameters": InferParameters,
}


# --------------------------------------------------------------------------------------------------
# Model-dependent limits, parsed requests and results


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What a model accepts, from its configuration and its own metadata (None: not checked here,
    e.g. by a client forwarding to a remote server that checks it).

    `vocab_size`: token ids are in [0, vocab_size). `max_seq_len`: prompt + generated tokens (the
    context). `max_position_embeddings`: the trained context. `max_input_tokens`: a configured cap on
    prompts. `max_iter_times`: a configured cap on `max_new_tokens`. `default_top_k`: from the model's
    generation config, else 1000.
    """

    vocab_size: int | None = None
    max_seq_len: int | None = None
    max_position_embeddings: int | None = None
    max_input_tokens: int | None = None
    max_iter_times: int | None = None
    default_top_k: int = DEFAULT_TOP_K

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt in tokens: min(1024*1024, max_input_tokens, max_seq_len - 1,
        max_position_embeddings), ignoring the unknown ones (MindIE's rule)."""
        bounds = [PROMPT_TOKENS_CAP, self.max_input_tokens, self.max_position_embeddings]
        if self.max_seq_len is not None:
            bounds.append(self.max_seq_len - 1)
        return min(b for b in bounds if b is not None)

    def describe_prompt_limit(self) -> str:
        """Where `max_prompt_tokens` comes from, for messages."""
        parts = [f"{PROMPT_TOKENS_CAP}"]
        if self.max_input_tokens is not None:
            parts.append(f"max_input_tokens {self.max_input_tokens}")
        if self.max_seq_len is not None:
            parts.append(f"max_seq_len - 1 = {self.max_seq_len - 1}")
        if self.max_position_embeddings is not None:
            parts.append(f"max_position_embeddings {self.max_position_embeddings}")
        if len(parts) == 1:
            return f"the cap of {PROMPT_TOKENS_CAP} tokens"
        return "the least of " + ", ".join(parts)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Resolved generation parameters (defaults applied, caps enforced).

    `do_sample` False is greedy decoding (temperature/top_k/top_p unused). `seed` None draws a random
    seed. `max_new_tokens` is already capped by `max_iter_times`. `priority` 1 is served first;
    `timeout` is in seconds, counted from submission, waiting included.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = DEFAULT_TOP_K
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    priority: int = DEFAULT_PRIORITY
    timeout: float = DEFAULT_TIMEOUT_S

    def as_parameters(self) -> dict[str, Any]:
        """The KServe `parameters` object stating every value explicitly (for forwarding)."""
        params: dict[str, Any] = {
            "do_sample": self.do_sample,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
            "max_new_tokens": self.max_new_tokens,
            "priority": self.priority,
            "timeout": math.ceil(self.timeout),
        }
        if self.seed is not None:
            params["seed"] = self.seed
        return params


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """A valid token request: its `id` (given or generated), the prompt `input_ids`, the name of the
    requested output and the resolved sampling `params`."""

    id: str
    input_ids: list[int]
    output_name: str
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class TokenResult:
    """Generated token ids; `finish_reason` is `stop` (an end-of-generation token, included as the last
    id) or `length` (max_new_tokens or the context ran out)."""

    ids: list[int]
    finish_reason: Literal["stop", "length"]


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
        parsed = InferRequestBody.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        message, path = _message(first)
        raise InferError(400, message, param=path, missing=first["type"] == "missing") from None

    tensor = parsed.inputs[0]
    n = len(tensor.data)
    _check_shape(tensor.shape, n)
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
    params = _resolve(parsed.parameters or InferParameters(), limits or ModelLimits())
    request_id = parsed.id if parsed.id is not None else uuid.uuid4().hex
    return TokenRequest(
        id=request_id, input_ids=list(tensor.data), output_name=parsed.outputs[0].name, params=params
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


def _resolve(p: InferParameters, limits: ModelLimits) -> SamplingParams:
    sampling_given = p.temperature is not None or p.top_k is not None or p.top_p is not None
    top_k = p.top_k if p.top_k is not None else limits.default_top_k
    if limits.vocab_size is not None:
        top_k = min(top_k, limits.vocab_size)  # MindIE: a top_k at or above the vocabulary means all of it
    max_new = p.max_new_tokens if p.max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS
    if limits.max_iter_times is not None:
        max_new = min(max_new, limits.max_iter_times)
    return SamplingParams(
        do_sample=p.do_sample if p.do_sample is not None else sampling_given,
        temperature=p.temperature if p.temperature is not None else 1.0,
        top_k=top_k,
        top_p=p.top_p if p.top_p is not None else 1.0,
        seed=p.seed,
        repetition_penalty=p.repetition_penalty if p.repetition_penalty is not None else 1.0,
        max_new_tokens=max_new,
        priority=p.priority if p.priority is not None else DEFAULT_PRIORITY,
        timeout=float(p.timeout if p.timeout is not None else DEFAULT_TIMEOUT_S),
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
