"""The Amazon Bedrock backend: OpenAI chat requests answered through the Converse API (boto3), and
embeddings through InvokeModel (`batchinfer.backends.bedrock_embed`).

Converse reference: https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html

Request mapping (OpenAI -> Converse):
- `system`/`developer` messages -> `system` text blocks; `user`/`assistant` messages -> `messages`,
  consecutive messages of one role merged into one message (Converse wants the roles to alternate);
- `max_completion_tokens`/`max_tokens` (else the model's `default_max_tokens`) -> `inferenceConfig.maxTokens`,
  `temperature` -> `temperature`, `top_p` -> `topP`, `stop` -> `stopSequences`;
- vLLM's `top_k` extension k > 0 -> `additionalModelRequestFields` (Anthropic and Nova models only:
  `batchinfer.backends.bedrock_messages.top_k_fields`), -1 or 0 -> nothing (the whole vocabulary);
- `seed` is ignored (Converse has none); `presence_penalty`, `frequency_penalty` and `response_format`
  `json_object` are rejected with 400, as are `n` > 1, `logprobs` and tools (`wire.chat.ChatRequest`).

Answer mapping: `stopReason` `end_turn`/`stop_sequence` -> `stop`, `max_tokens` -> `length`,
`guardrail_intervened`/`content_filtered` -> `content_filter`; `usage.inputTokens`/`outputTokens` ->
`prompt_tokens`/`completion_tokens`. The client does not retry (botocore `max_attempts` 1): the shard
worker owns retries, and `BackendError.retryable` says which errors may succeed later.

An Anthropic model with the registry's `api: anthropic_messages` is called through InvokeModel with
Anthropic's Messages body instead (`batchinfer.backends.bedrock_messages`), and answers Message Batch
requests natively (`create_message`).
"""

from __future__ import annotations

import asyncio
import uuid
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from batchinfer.backends.base import BackendError, chat_request
from batchinfer.backends.bedrock_embed import embeddings_model, invoke_embeddings
from batchinfer.backends.bedrock_messages import (
    converse_as_messages,
    invoke_messages,
    message_of_answer,
    messages_body,
    top_k_fields,
)
from batchinfer.wire.chat import ChatCompletionResponse
from batchinfer.wire.openai import CHAT_ENDPOINT, EMBEDDINGS_ENDPOINT, RESPONSES_ENDPOINT

if TYPE_CHECKING:
    from batchinfer.backends.config import BedrockConfig
    from batchinfer.wire.anthropic import MessageParams

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
        # Message Batches send their params as they are (`create_message`), not as chat.
        self.messages_native = config.api == "anthropic_messages"

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
        if request.top_k is not None and request.top_k > 0:
            kwargs["additionalModelRequestFields"] = top_k_fields(self.config.model_id, request.top_k)
        return kwargs

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one OpenAI chat completions body with a `chat.completion` dict.

        Raises `BackendError`: 400 for the body (before any call), the mapped Converse error
        (`_ERRORS`: ThrottlingException -> 429 retryable, ValidationException -> 400, ...),
        504 `timeout` / 502 `upstream_unavailable` (retryable) when Bedrock cannot be reached in time.
        """
        kwargs = self.converse_request(body)
        if self.messages_native:
            return await self._chat_by_messages(kwargs)
        answer = await self._call(self.client.converse, **kwargs)
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

    async def _call(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """`call(*args, **kwargs)` in a thread; botocore's errors raised as their `BackendError`."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return await asyncio.to_thread(call, *args, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc) from None

    async def _chat_by_messages(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The `chat.completion` of Converse arguments sent as a Messages body through InvokeModel."""
        body = converse_as_messages(kwargs)
        answer = await self._call(invoke_messages, self.client, self.config.model_id, body)
        usage = answer.get("usage") or {}
        return ChatCompletionResponse.answer(
            id=f"chatcmpl-{str(answer.get('id') or uuid.uuid4().hex).removeprefix('msg_')}",
            model=self.name,
            content="".join(b.get("text", "") for b in answer.get("content") or []),
            finish_reason=_FINISH.get(answer.get("stop_reason") or "", "stop"),
            prompt_tokens=int(usage.get("input_tokens") or 0),
            completion_tokens=int(usage.get("output_tokens") or 0),
        ).model_dump()

    async def create_message(self, params: MessageParams) -> dict[str, Any]:
        """Answer one Message Batch request natively (`api: anthropic_messages`): its params as a
        Messages body through InvokeModel; the `Message`, named `params.model`. Raises `BackendError`
        as `chat_completion` does for a failed call."""
        answer = await self._call(invoke_messages, self.client, self.config.model_id, messages_body(params))
        return message_of_answer(answer, params.model)

    async def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one OpenAI embeddings body through InvokeModel (`batchinfer.backends.bedrock_embed`).

        Raises `BackendError`: 400 for what the model cannot take (before any call), else the mapped
        error of the call, as `chat_completion` does.
        """
        return await self._call(invoke_embeddings, self.client, self.config.model_id, self.name, body)

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
