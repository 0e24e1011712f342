"""Bedrock's model-specific request fields, and Anthropic models served natively: InvokeModel with
Anthropic's Messages body (`anthropic_version` `bedrock-2023-05-31`), the registry's `api:
anthropic_messages` of a Bedrock model.

Body reference: https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages.html

- A Message Batch request's params go as they are (text messages, `system`, `stop_sequences`,
  `temperature`, `top_p`, `top_k`), without `model` (the model id is the call's), `metadata` and
  `service_tier` (Bedrock's body has no such fields); the answer is the request's `Message`.
- A chat request is first mapped as for Converse (`BedrockBackend.converse_request`), then written as
  a Messages body; its answer becomes a `chat.completion` (stop reasons as Converse's).
- `top_k` through Converse (`top_k_fields`): `additionalModelRequestFields` `{"top_k"}` for Anthropic
  models, `{"inferenceConfig": {"topK"}}` for Amazon Nova; other models have none (400).
"""

from __future__ import annotations

import json
from typing import Any

from batchinfer.backends.base import BackendError
from batchinfer.backends.config import bedrock_provider
from batchinfer.wire.anthropic import Message, MessageParams

__all__ = ["ANTHROPIC_VERSION", "invoke_messages", "message_of_answer", "messages_body", "top_k_fields"]

ANTHROPIC_VERSION = "bedrock-2023-05-31"
# Messages params Bedrock's body has no field for.
_NOT_SENT = frozenset({"model", "metadata", "service_tier"})
_STOP_REASONS = frozenset({"end_turn", "max_tokens", "stop_sequence"})
# Converse's `inferenceConfig` names -> the Messages body's.
_SAMPLING = (("temperature", "temperature"), ("topP", "top_p"), ("stopSequences", "stop_sequences"))


def top_k_fields(model_id: str, top_k: int) -> dict[str, Any]:
    """Converse's `additionalModelRequestFields` for `top_k` > 0 on `model_id` (see the module
    docstring). Raises `BackendError(400, unsupported_parameter)` for a model without a top_k field."""
    if bedrock_provider(model_id) == "anthropic":
        return {"top_k": top_k}
    if bedrock_provider(model_id) == "amazon" and ".nova-" in model_id:
        return {"inferenceConfig": {"topK": top_k}}
    raise BackendError(
        400,
        f"'top_k' is not supported by Bedrock model {model_id} (Anthropic and Amazon Nova models only).",
        code="unsupported_parameter",
        param="top_k",
    )


def messages_body(params: MessageParams) -> dict[str, Any]:
    """The InvokeModel body of a Message Batch request's params (see the module docstring)."""
    body = params.model_dump(mode="json", exclude_none=True, exclude=_NOT_SENT)
    return {"anthropic_version": ANTHROPIC_VERSION, **body}


def converse_as_messages(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The Messages body of Converse keyword arguments (`BedrockBackend.converse_request`)."""
    inference = kwargs["inferenceConfig"]
    body: dict[str, Any] = {
        "anthropic_version": ANTHROPIC_VERSION,
        "max_tokens": inference["maxTokens"],
        "messages": [
            {"role": m["role"], "content": [{"type": "text", "text": b["text"]} for b in m["content"]]}
            for m in kwargs["messages"]
        ],
    }
    if "system" in kwargs:
        body["system"] = [{"type": "text", "text": block["text"]} for block in kwargs["system"]]
    for ours, theirs in _SAMPLING:
        if ours in inference:
            body[theirs] = inference[ours]
    body.update(kwargs.get("additionalModelRequestFields") or {})
    return body


def invoke_messages(client: Any, model_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """InvokeModel `model_id` with a Messages `body`; the answer's JSON (an Anthropic Message).
    botocore's errors propagate (the caller maps them)."""
    answer = client.invoke_model(
        modelId=model_id, body=json.dumps(body), contentType="application/json", accept="application/json"
    )
    return json.loads(answer["body"].read())


def message_of_answer(answer: dict[str, Any], model: str) -> dict[str, Any]:
    """Our `Message` of Bedrock's answer, named `model`: its text blocks, `stop_reason` (one Message
    Batches results know, else `end_turn`), `stop_sequence` and usage."""
    reason = answer.get("stop_reason")
    reason = reason if reason in _STOP_REASONS else "end_turn"
    usage = answer.get("usage") or {}
    return Message(
        id=str(answer.get("id") or ""),
        model=model,
        content=[{"type": "text", "text": "".join(b.get("text", "") for b in answer.get("content") or [])}],
        stop_reason=reason,
        stop_sequence=answer.get("stop_sequence") if reason == "stop_sequence" else None,
        usage={
            "input_tokens": int(usage.get("input_tokens") or 0),
            "output_tokens": int(usage.get("output_tokens") or 0),
        },
    ).model_dump()
