"""What every backend module shares: the protocols a model implements, the errors it raises, and the
checks of a request body before it is sent anywhere. Backends know nothing of batches.

Imports point one way in this package: `base` -> `config` (the registry's options) -> `http` (the
remote backends' POST and status mapping) and `llama_engine` (the embedded model's continuous
batching) -> each backend -> `registry` (which builds them).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from batchinfer.wire.chat import ChatRequest, ChatRequestError, read_chat_request
from batchinfer.wire.completions import CompletionRequest, read_completion_request
from batchinfer.wire.tokens import ModelLimits, SamplingParams, TokenResult

__all__ = [
    "BackendError",
    "BackendNotImplemented",
    "ChatBackend",
    "ModelNotFound",
    "RegistryError",
    "TokenBackend",
    "chat_request",
    "completion_request",
    "require_utf8",
    "unencodable_path",
]


class BackendError(Exception):
    """A request the backend rejected or could not serve.

    `status_code` is the HTTP status to report in the result line (4xx: the request is at fault,
    5xx: the backend is), `code`/`message` fill the OpenAI error body, and `retryable` says whether
    trying again may succeed (429, 5xx, timeouts, connection resets).
    """

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        code: str | None = None,
        type: str = "invalid_request_error",
        param: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.code = code
        self.type = type
        self.param = param
        self.retryable = retryable
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        """The OpenAI error envelope `{"error": {message, type, param, code}}`."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class RequestNotStarted(Exception):
    """A backend gave a request back before it reached the model: it was still waiting (e.g. queued for
    the embedded model's thread) when its caller withdrew it (`withdraw_waiting`). Sending it again
    later runs it once."""


class ModelNotFound(LookupError):
    """A request named a model that the registry does not list; `name` is that model name."""

    def __init__(self, name: str) -> None:
        # OpenAI's wording for the same case (error code `model_not_found`).
        super().__init__(f"The model '{name}' does not exist or you do not have access to it.")
        self.name = name


class RegistryError(ValueError):
    """The registry file is missing, is not YAML, or does not validate (the message names the file
    and, for each problem, the dotted location `models.<name>.<option>` and what is wrong); or a
    backend cannot be built from its options (a missing model file, an unset key variable)."""


class BackendNotImplemented(NotImplementedError):
    """The registry names a backend kind that this release accepts in the file but cannot run yet."""


class ChatBackend(Protocol):
    """A model that answers OpenAI `/v1/chat/completions` request bodies.

    A backend may also have `concurrency_hint: int | None`, the requests worth having in flight on it
    from one process (an in-process engine's sequences); the shard worker then keeps that many in
    flight (at most `WORKER_CONCURRENCY`) instead of finding a remote backend's capacity.
    """

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Return a `chat.completion` object (with `usage`) for a request body; raise `BackendError`."""
        ...


@runtime_checkable
class Withdrawable(Protocol):
    """A backend that holds requests waiting for its model (a queue in front of it) and can give them
    back: each waiting `chat_completion` then raises `RequestNotStarted`; requests the model is
    already working on go on."""

    def withdraw_waiting(self) -> int:
        """Give back every request still waiting for the model; returns how many."""
        ...


@runtime_checkable
class TokenBackend(Protocol):
    """A model that generates token ids from token ids (the embedded model, a remote KServe server)."""

    async def token_limits(self) -> ModelLimits:
        """The limits requests to this model are checked against (may load the model)."""
        ...

    async def generate_tokens(self, input_ids: list[int], params: SamplingParams) -> TokenResult:
        """Generate up to `params.max_new_tokens` ids after `input_ids`; raise `BackendError`."""
        ...


def unencodable_path(value: Any, path: str = "") -> str | None:
    """The OpenAI-style path (`messages[0].content`) of the first string in `value` that is not valid
    Unicode, or None when every string (keys included) encodes as UTF-8.

    Such strings hold lone surrogates (`"\\ud800"`), which `json.loads` accepts from `\\u` escapes
    but which no UTF-8 encoder, tokenizer or HTTP body can carry.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "(body)"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            key_path = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and unencodable_path(key, key_path) is not None:
                return key_path
            found = unencodable_path(item, key_path)
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = unencodable_path(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def require_utf8(body: dict[str, Any]) -> None:
    """Raise `BackendError(400, code="invalid_encoding", param=<path>)` when a string of `body`
    cannot be encoded as UTF-8 (a lone surrogate); return None otherwise."""
    path = unencodable_path(body)
    if path is not None:
        raise BackendError(
            400,
            f"Invalid value at '{path}': the string contains a lone UTF-16 surrogate and is not valid "
            "Unicode text.",
            code="invalid_encoding",
            param=path,
        )


def chat_request(body: dict[str, Any], *, unsupported_by: str | None = None) -> ChatRequest:
    """A chat completions body as a text-only model reads it (`batchinfer.wire.chat.ChatRequest`).

    Raises `BackendError(400)`: `invalid_encoding` for a lone surrogate (`require_utf8`), else the
    code and message of `read_chat_request`. With `unsupported_by` (the model's kind, for the
    message: "Bedrock models"), also for presence/frequency penalties and JSON mode, which only
    llama.cpp's sampler honours.
    """
    require_utf8(body)
    try:
        request = read_chat_request(body)
        if unsupported_by is not None:
            request.only_plain_sampling(unsupported_by)
    except ChatRequestError as error:
        raise BackendError(400, error.message, code=error.code, param=error.param) from None
    return request


def completion_request(body: dict[str, Any]) -> CompletionRequest:
    """A completions body as a raw-prompt model reads it (`batchinfer.wire.completions`). Raises
    `BackendError(400)`: `invalid_encoding` for a lone surrogate, else the code and message of
    `read_completion_request`."""
    require_utf8(body)
    try:
        return read_completion_request(body)
    except ChatRequestError as error:
        raise BackendError(400, error.message, code=error.code, param=error.param) from None
