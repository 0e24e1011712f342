"""The Responses wire shapes: a body as chat, and the Response object built from a chat completion."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response

from batchinfer.wire.responses import ResponseBody, ResponseObject, chat_body


def _completion(finish_reason: str) -> dict[str, Any]:
    return {
        "model": "smol",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "{}"}, "finish_reason": finish_reason}
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35},
    }


def test_items_instructions_and_options_become_one_chat_body() -> None:
    body = ResponseBody.model_validate(
        {
            "model": "smol",
            "instructions": "Answer in JSON.",
            "input": [
                {"role": "developer", "content": "Be exact."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                },
                {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
            ],
            "max_output_tokens": 12,
            "temperature": 0.5,
            "top_p": 0.9,
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
            "seed": 4,
        }
    )

    assert chat_body(body) == {
        "model": "smol",
        "messages": [
            {"role": "system", "content": "Answer in JSON."},
            {"role": "developer", "content": "Be exact."},
            {"role": "user", "content": "a\nb"},
            {"role": "assistant", "content": "ok"},
        ],
        "max_completion_tokens": 12,
        "temperature": 0.5,
        "top_p": 0.9,
        "response_format": {"type": "json_object"},
    }


def test_a_completed_response_has_openais_shape() -> None:
    body = ResponseBody.model_validate(
        {
            "model": "smol",
            "input": "Hi",
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
            "metadata": {"k": "v"},
        }
    )

    out = ResponseObject.from_chat(body, _completion("stop")).model_dump()

    assert Response.model_validate(out).output_text == "{}"  # the SDK's own type reads it
    assert out.pop("id").startswith("resp_")
    assert isinstance(out.pop("created_at"), int)
    assert out["output"][0].pop("id").startswith("msg_")
    assert out == {
        "object": "response",
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": "smol",
        "output": [
            {
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "{}", "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": 30,
            "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 35,
        },
        "metadata": {"k": "v"},
    }


@pytest.mark.parametrize(
    ("finish_reason", "status", "details"),
    [
        ("stop", "completed", None),
        ("length", "incomplete", {"reason": "max_output_tokens"}),
        ("content_filter", "incomplete", {"reason": "content_filter"}),
    ],
)
def test_a_cut_answer_is_incomplete_with_its_reason(
    finish_reason: str, status: str, details: dict[str, str] | None
) -> None:
    body = ResponseBody.model_validate(
        {"model": "smol", "input": "Hi", "max_output_tokens": 5, "temperature": 0}
    )

    out = ResponseObject.from_chat(body, _completion(finish_reason)).model_dump()

    assert (out["status"], out["incomplete_details"], out["output"][0]["status"]) == (status, details, status)
    assert (out["max_output_tokens"], out["temperature"], out["text"]) == (5, 0, {"format": {"type": "text"}})
