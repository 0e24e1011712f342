"""The Amazon Bedrock backend: OpenAI chat requests answered through the Converse API (boto3), and
embeddings through InvokeModel (`batchinfer.backends.bedrock_embed`).

Converse reference: https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html

Request mapping (OpenAI -> Converse):
- `system`/`developer` messages -> `system` text blocks; `user`/`assistant` messages -> `messages`,
  consecutive messages of one role merged into one message (Converse wants the roles to alternate);
- `max_completion_tokens`/`max_tokens` (else the model's `default_max_tokens`) -> `inferenceConfig.maxTokens`,
  `temperature` -> `temperature`, `top_p` -> `topP`, `stop` -> `stopSequences`;
- `seed` is ignored (Converse has none); `presence_penalty`, `frequency_penalty` and `response_format`
  `json_object` are rejected with 400, as are `n` > 1, `logprobs` and tools (`wire.chat.ChatRequest`).

Answer mapping: `stopReason` `end_turn`/`stop_sequence` -> `stop`, `max_tokens` -> `length`,
`guardrail_intervened`/`content_filtered` -> `content_filter`; `usage.inputTokens`/`outputTokens` ->
`prompt_tokens`/`completion_tokens`. The client does not retry (botocore `max_attempts` 1): the shard
worker owns retries, and `BackendError.retryable` says which errors may succeed later.
"""

from __future__ import annotations

import asyncio
import uuid
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from batchinfer.backends.base import BackendError, chat_request
from batchinfer.backends.bedrock_embed import embeddings_model, invoke_embeddings
from batchinfer.wire.chat import ChatCompletionResponse
from batchinfer.wire.openai import CHAT_ENDPOINT, EMBEDDINGS_ENDPOINT, RESPONSES_ENDPOINT

if TYPE_CHECKING:
    from batchinfer.backends.config import BedrockConfig

__all__ = ["BedrockBackend"]

# Converse error codes -> (HTTP status to report, OpenAI error code, retryable); from the API reference's
# "Errors" section. Unknown codes fall back to the HTTP status of the answer.
_ERRORS: dict[str, tuple[int, str, bool]] = {
    "ValidationException": (400, "invalid_value", False),
    "AccessDeniedException": (403, "access_denied", False),
    "ResourceNotFoundException": (404, "model_not_found", False),
    "ModelTimeoutException": (408, "timeout", True),
    "ModelErrorException": (424, "model_error", False),
    "ThrottlingException": (429, "rate_limit_exceeded", True),
    "ServiceQuotaExceededException": (429, "rate_limit_exceeded", True),
    "ModelNotReadyException": (429, "model_not_ready", True),
    "InternalServerException": (500, "server_error", True),
    "ServiceUnavailableException": (503, "server_error", True),
}
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
    "tool_use": "tool_calls",
}


class BedrockBackend:
    """A `ChatBackend` answering as registry model `name` with Bedrock model `config.model_id`.

    The boto3 `bedrock-runtime` client (`client`) is created on first use, in `config.region` or the
    function's own region. `serves`: chat, and Responses translated to chat (hence to Converse); an
    embedding model's (`serves_for`), embeddings only.
    """

    serves: ClassVar[frozenset[str]] = frozenset({CHAT_ENDPOINT, RESPONSES_ENDPOINT})

    def __init__(self, name: str, config: BedrockConfig) -> None:
        self.name = name
        self.config = config
        self.serves = self.serves_for(config)  # type: ignore[misc]

    @classmethod
    def serves_for(cls, config: BedrockConfig) -> frozenset[str]:
        """What a model of `config` serves: embeddings only for an embedding model (Titan Text Embeddings
        V2, Cohere Embed), else `serves`."""
        return (
            frozenset({EMBEDDINGS_ENDPOINT}) if embeddings_model(config.model_id) is not None else cls.serves
        )

    @cached_property
    def client(self) -> Any:
        """The `bedrock-runtime` client (no retries of its own, `timeout` as read timeout)."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "bedrock-runtime",
            region_name=self.config.region,
            config=Config(
                retries={"max_attempts": 1, "mode": "standard"},
                read_timeout=self.config.timeout,
                connect_timeout=10,
            ),
        )

    def converse_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Converse keyword arguments for an OpenAI chat body; raises `BackendError(400)` for what
        Converse cannot express (see the module docstring)."""
        request = chat_request(body, unsupported_by="Bedrock models")
        system: list[dict[str, str]] = []
        messages: list[dict[str, Any]] = []
        for message in request.messages:
            if message.role in ("system", "developer"):
                system.append({"text": message.content})
            elif messages and messages[-1]["role"] == message.role:
                messages[-1]["content"].append({"text": message.content})
            else:
                messages.append({"role": message.role, "content": [{"text": message.content}]})
        if not messages or messages[0]["role"] != "user":
            raise BackendError(
                400,
                "Bedrock needs the first non-system message to be a user message.",
                code="invalid_value",
                param="messages",
            )
        inference: dict[str, Any] = {
            "maxTokens": request.max_completion_tokens or request.max_tokens or self.config.default_max_tokens
        }
        if request.temperature is not None:
            inference["temperature"] = request.temperature
        if request.top_p is not None:
            inference["topP"] = request.top_p
        if request.stop:
            inference["stopSequences"] = (
                [request.stop] if isinstance(request.stop, str) else list(request.stop)
            )
        kwargs: dict[str, Any] = {
            "modelId": self.config.model_id,
            "messages": messages,
            "inferenceConfig": inference,
        }
        if system:
            kwargs["system"] = system
        return kwargs

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one OpenAI chat completions body with a `chat.completion` dict.

        Raises `BackendError`: 400 for the body (before any call), the mapped Converse error
        (`_ERRORS`: ThrottlingException -> 429 retryable, ValidationException -> 400, ...),
        504 `timeout` / 502 `upstream_unavailable` (retryable) when Bedrock cannot be reached in time.
        """
        from botocore.exceptions import BotoCoreError, ClientError, ConnectTimeoutError, ReadTimeoutError

        kwargs = self.converse_request(body)
        try:
            answer = await asyncio.to_thread(self.client.converse, **kwargs)
        except (ClientError, ReadTimeoutError, ConnectTimeoutError, BotoCoreError) as exc:
            raise self._error(exc) from None
        blocks = answer["output"]["message"]["content"]
        usage = answer["usage"]
        return ChatCompletionResponse.answer(
            id=f"chatcmpl-{answer.get('ResponseMetadata', {}).get('RequestId') or uuid.uuid4().hex}",
            model=self.name,
            content="".join(b.get("text", "") for b in blocks),
            finish_reason=_FINISH.get(answer["stopReason"], "stop"),
            prompt_tokens=usage["inputTokens"],
            completion_tokens=usage["outputTokens"],
        ).model_dump()

    async def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one OpenAI embeddings body through InvokeModel (`batchinfer.backends.bedrock_embed`).

        Raises `BackendError`: 400 for what the model cannot take (before any call), else the mapped
        error of the call, as `chat_completion` does.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return await asyncio.to_thread(
                invoke_embeddings, self.client, self.config.model_id, self.name, body
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc) from None

    def _error(self, exc: Exception) -> BackendError:
        """The `BackendError` of a failed Converse call: a `ClientError` mapped by `_ERRORS` (else by
        its HTTP status), 504 `timeout` for a read or connect timeout, 502 `upstream_unavailable` for
        any other botocore failure."""
        from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = error.get("Code", "")
            http_status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500)
            status, our_code, retryable = _ERRORS.get(code) or (
                http_status,
                code or "server_error",
                http_status >= 500,
            )
            return BackendError(
                status,
                f"Bedrock {code}: {error.get('Message', str(exc))}",
                type="server_error"
                if status >= 500
                else "requests"
                if status == 429
                else "invalid_request_error",
                code=our_code,
                retryable=retryable,
            )
        if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError)):
            return BackendError(
                504,
                f"Bedrock did not answer within {self.config.timeout:g} s.",
                type="server_error",
                code="timeout",
                retryable=True,
            )
        return BackendError(
            502,
            f"Cannot reach Bedrock ({type(exc).__name__}).",  # what failed, not where
            type="server_error",
            code="upstream_unavailable",
            retryable=True,
        )
