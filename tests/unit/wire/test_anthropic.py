"""Unit tests of `batchinfer.wire.anthropic`: the Messages params a batch request may carry, the create
body's rules, and the MessageBatch's RFC 3339 times."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from batchinfer.wire.anthropic import CreateMessageBatch, MessageBatch, MessageParams, RequestCounts, rfc3339

USER = {"role": "user", "content": "Hi"}


def params(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": [USER], **fields}


def test_the_chat_body_puts_the_system_prompt_first_and_maps_the_sampling_fields() -> None:
    given = params(
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        messages=[USER, {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]}, USER],
        stop_sequences=["END"],
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        metadata={"user_id": "u1"},
    )

    assert MessageParams.model_validate(given).chat_body() == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Hi"},
        ],
        "max_tokens": 8,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "stop": ["END"],
    }


def test_a_minimal_request_maps_to_a_minimal_chat_body() -> None:
    assert MessageParams.model_validate(params()).chat_body() == {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
    }


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"max_tokens": 0}, "greater than or equal to 1"),
        ({"temperature": 1.5}, "less than or equal to 1"),
        ({"messages": []}, "at least 1 item"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "the first message must have role 'user'"),
        ({"messages": [USER, USER]}, "must alternate"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "'text'"),
        ({"tools": []}, "tools not supported by this service"),
        ({"thinking": {"type": "enabled"}}, "thinking not supported"),
        ({"stream": True}, "stream not supported"),
        ({"frequency_penalty": 1}, "Extra inputs are not permitted"),
        ({"stop_sequences": [""]}, "at least 1 character"),
        ({"model": 7}, "valid string"),
    ],
)
def test_params_the_service_cannot_serve_are_refused(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as caught:
        MessageParams.model_validate(params(**fields))
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("requests", "problem"),
    [
        ([{"custom_id": "a" * 65, "params": {}}], "String should match pattern"),
        ([{"custom_id": "a.b", "params": {}}], "String should match pattern"),
        ([{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}], "more than one request"),
        ([], "at least 1 item"),
        ([{"custom_id": "a", "params": "x"}], "valid dictionary"),
    ],
)
def test_the_create_body_needs_unique_well_formed_custom_ids(requests: list[Any], problem: str) -> None:
    with pytest.raises(ValidationError) as caught:
        CreateMessageBatch.model_validate({"requests": requests})
    assert problem in str(caught.value)


def test_a_message_batch_shows_rfc3339_times() -> None:
    batch = MessageBatch(
        id="batch_1",
        processing_status="in_progress",
        request_counts=RequestCounts(processing=2),
        created_at=1_800_000_000,
        expires_at=1_800_086_400,
    )

    assert batch.model_dump(mode="json") == {
        "id": "batch_1",
        "type": "message_batch",
        "processing_status": "in_progress",
        "request_counts": {"processing": 2, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
        "created_at": "2027-01-15T08:00:00Z",
        "expires_at": "2027-01-16T08:00:00Z",
        "ended_at": None,
        "cancel_initiated_at": None,
        "archived_at": None,
        "results_url": None,
    }
    assert rfc3339(None) is None
