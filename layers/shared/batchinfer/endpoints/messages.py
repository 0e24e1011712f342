"""`/v1/messages`: Anthropic Messages requests of a Message Batch, served as chat completions.

A line of such a batch is written by the Message Batches routes (`batchinfer.api.anthropic`), never
by a user: its body is `{"model": <the batch's model>, "params": <the request's params as sent>}`.
The params are checked when the request runs (`MessageParams`), so one bad request ends as an
`errored` result (a 400 `invalid_request_error` line) while the rest of the batch runs; `model` is
the model the batch's shards are scheduled on (the first request's known model), and a request
naming another model of the registry runs on that model's backend. The chat answer becomes a
`Message` (`message_of`); its usage counts input and output tokens.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from batchinfer.backends.base import BackendError
from batchinfer.endpoints.base import Endpoint, Server, Usage
from batchinfer.wire.anthropic import MESSAGES_ENDPOINT, Message, MessageParams
from batchinfer.wire.line_errors import ErrorCode, LineError
from batchinfer.wire.messages import loc_path
from batchinfer.wire.openai import CHAT_ENDPOINT

__all__ = ["Messages", "MessagesServer", "message_of", "params_problem"]

_STOP_REASON = {"stop": "end_turn", "length": "max_tokens"}


def params_problem(error: ValidationError) -> str:
    """The first problem of a request's params, as `<field>: <message>` (or the message alone)."""
    first = error.errors()[0]
    where = loc_path([part for part in first["loc"] if part != "params"])
    message = first["msg"].removeprefix("Value error, ")
    return f"params.{where}: {message}" if where else f"params: {message}"


def message_of(answer: dict[str, Any], params: MessageParams) -> dict[str, Any]:
    """The `Message` of a chat completions `answer` to `params`: its text, `stop_reason` `max_tokens`
    at the limit (`finish_reason` `length`), `stop_sequence` when the backend names one of
    `params.stop_sequences` as where it stopped, else `end_turn`; usage in input/output tokens."""
    choice, usage = answer["choices"][0], answer.get("usage") or {}
    sequence = _matched_stop(choice, params)
    reason = _STOP_REASON.get(choice.get("finish_reason"), "end_turn")
    if reason == "end_turn" and sequence is not None:
        reason = "stop_sequence"
    answer_id = str(answer.get("id") or "")
    return Message(
        id="msg_" + answer_id.removeprefix("chatcmpl-"),
        model=params.model,
        content=[{"type": "text", "text": choice["message"].get("content") or ""}],
        stop_reason=reason,
        stop_sequence=sequence if reason == "stop_sequence" else None,
        usage={
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
    ).model_dump()


def _matched_stop(choice: dict[str, Any], params: MessageParams) -> str | None:
    """The stop sequence a choice stopped at when its backend names it (`stop_reason`, as vLLM's
    server; `matched_stop`, as SGLang's); None when it cannot tell."""
    named = choice.get("stop_reason") or choice.get("matched_stop")
    return named if isinstance(named, str) and named in (params.stop_sequences or ()) else None


class MessagesServer:
    """The shard worker's view of a model for a Message Batch: checks each request's params, sends
    their chat body to the backend of the model they name (`backend_of`: the registry's; the batch's
    own `backend` for the batch's model) and answers the `Message`; a backend with `messages_native`
    (a Bedrock Anthropic model with `api: anthropic_messages`) answers the params itself
    (`create_message`). Raises `BackendError` 400 (`invalid_request_error`) for params it cannot
    serve, a model not in the registry included."""

    def __init__(self, backend: Any, backend_of: Callable[[str], Any] | None = None) -> None:
        self.backend = backend
        self.backend_of = backend_of
        self.concurrency_hint: int | None = getattr(backend, "concurrency_hint", None)

    def withdraw_waiting(self) -> int:
        """The batch's backend gives back its waiting requests (see `backends.base.Withdrawable`)."""
        withdraw = getattr(self.backend, "withdraw_waiting", None)
        return withdraw() if withdraw is not None else 0

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The `Message` answering one line's params (see the class docstring)."""
        try:
            params = MessageParams.model_validate(body.get("params"))
        except ValidationError as error:
            raise BackendError(400, params_problem(error), code="invalid_request_error") from None
        backend = self.backend
        if params.model != body.get("model"):
            backend = self.backend_of(params.model) if self.backend_of is not None else None
            if backend is None:
                raise BackendError(
                    400, f"params.model: model {params.model!r} is not served here", code="not_found_error"
                )
        if getattr(backend, "messages_native", False):  # serves Anthropic's Messages itself
            return await backend.create_message(params)
        answer = await backend.chat_completion(params.chat_body())
        return message_of(answer, params)


def _registry_backend(name: str) -> Any:
    """The registry's backend of model `name`, or None when it serves no such model."""
    from batchinfer.backends import load_registry
    from batchinfer.core.settings import get_settings

    registry = load_registry(get_settings().model_registry)
    return registry.backend(name) if name in registry else None


def plain_messages_body(body: dict[str, Any]) -> bool:
    """True for a line body as the Message Batches routes write it (see the module docstring)."""
    model = body.get("model")
    return type(model) is str and model != "" and type(body.get("params")) is dict


class Messages(Endpoint):
    """The Messages endpoint of Message Batches (see the module docstring)."""

    template = MESSAGES_ENDPOINT
    pattern = re.compile(re.escape(MESSAGES_ENDPOINT))
    model_param = "body.model"
    body_model = MessageParams
    result_model = Message
    plain_body = staticmethod(plain_messages_body)
    listed = False

    def served_by(self, serves: frozenset[str]) -> bool:
        """Messages are answered through chat (`MessagesServer`): a model that serves chat serves them."""
        return CHAT_ENDPOINT in serves

    def check_body(self, body: dict[str, Any], line: int) -> list[LineError]:
        """Only the line's shape: the params themselves are checked when the request runs."""
        if plain_messages_body(body):
            return []
        return [
            LineError(
                code=ErrorCode.INVALID_PARAMETER,
                message=f'Line {line}: body must be {{"model": "<name>", "params": {{...}}}}.',
                param="body",
                line=line,
            )
        ]

    def model_of(self, match: re.Match[str], body: dict[str, Any]) -> str | None:
        """`body.model`: the model the batch is scheduled on."""
        model = body.get("model")
        return model if isinstance(model, str) and model else None

    def server(self, backend: Any) -> Server:
        """A `MessagesServer` on the batch's backend, other models from the registry."""
        return MessagesServer(backend, _registry_backend)

    def usage(self, result: dict[str, Any]) -> Usage:
        """`usage.input_tokens` in, `usage.output_tokens` out (0 where absent)."""
        usage = result.get("usage") or {}
        return Usage(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0))
