"""The one chat completions schema: its fast path stays in step with it, and the backends' view of it
reads and rejects bodies with OpenAI's codes (the strict view's line errors: tests/unit/validation)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from pydantic import ValidationError

from batchinfer.wire.chat import (
    PLAIN_CHAT_FIELDS,
    PLAIN_MESSAGE_FIELDS,
    ChatCompletionBody,
    ChatCompletionResponse,
    ChatMessage,
    ChatRequest,
    ChatRequestError,
    TextMessage,
    plain_chat_body,
    read_chat_request,
)
from support.chat_bodies import BODIES

USER = [{"role": "user", "content": "Hi"}]


def test_the_fast_path_checks_every_field_of_the_schema() -> None:
    # A field added to ChatCompletionBody or ChatMessage needs its check in `plain_chat_body` (and its
    # name in PLAIN_*_FIELDS): until then the fast path would accept values the schema refuses.
    assert set(ChatCompletionBody.model_fields) == PLAIN_CHAT_FIELDS
    assert set(ChatMessage.model_fields) == PLAIN_MESSAGE_FIELDS


# Values of every JSON type, odd numbers included: for each field, the schema refuses some of them.
ODD_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    2,
    2**70,
    0.5,
    3.5,
    float("nan"),
    "",
    "x",
    [],
    ["a"] * 5,
    [1],
    {},
    {"a": 1},
]


@pytest.mark.parametrize("field", sorted(ChatCompletionBody.model_fields))
def test_the_fast_path_refuses_every_value_the_schema_refuses_field_by_field(field: str) -> None:
    # Catches a field listed in PLAIN_CHAT_FIELDS whose check is missing from `plain_chat_body`.
    plain = {"model": "m", "messages": USER}
    refused = []
    for value in ODD_VALUES:
        try:
            ChatCompletionBody.model_validate({**plain, field: value})
        except ValidationError:
            refused.append(value)

    assert refused, f"no odd value is refused for {field}: add one that is"
    assert [v for v in refused if plain_chat_body({**plain, field: v})] == []


@settings(max_examples=3000, deadline=None)
@given(BODIES)
def test_a_body_the_fast_check_accepts_is_one_the_model_accepts(body: dict[str, Any]) -> None:
    if plain_chat_body(body):
        try:
            ChatCompletionBody.model_validate(body)
        except ValidationError as error:
            pytest.fail(f"fast path accepted {body!r}: {error}")


def test_the_fast_check_accepts_a_plain_body_and_refuses_what_it_does_not_know() -> None:
    plain = {"model": "m", "messages": USER, "max_tokens": 5, "temperature": 0.5, "stop": ["a"], "seed": 1}

    assert plain_chat_body(plain) is True
    assert plain_chat_body({**plain, "max_tokens": True}) is False
    assert plain_chat_body({**plain, "messages": [{"role": "user", "content": [{"type": "text"}]}]}) is False


def test_the_backends_view_is_derived_from_the_schema() -> None:
    # Every field rule of the strict schema holds in the view too (one schema, read two ways).
    assert set(ChatCompletionBody.model_fields) < set(ChatRequest.model_fields)
    assert issubclass(ChatRequest, ChatCompletionBody)
    assert issubclass(TextMessage, ChatMessage)


def test_a_text_request_is_read_with_text_parts_joined() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = read_chat_request(
        {
            "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": parts}],
            "stop": "x",
            "presence_penalty": 0.5,
            "response_format": {"type": "json_object"},
        }
    )

    assert [(m.role, m.content) for m in request.messages] == [("developer", "Be brief."), ("user", "a\nb")]
    assert (request.model, request.stop, request.presence_penalty) == (None, "x", 0.5)
    assert request.response_format is not None and request.response_format.type == "json_object"


@pytest.mark.parametrize(
    ("body", "code", "param", "message"),
    [
        ({}, "missing_required_parameter", "messages", "Missing required parameter: 'messages'."),
        (
            {"messages": [{"role": "user"}]},
            "missing_required_parameter",
            "messages[0].content",
            "Missing required parameter: 'messages[0].content'.",
        ),
        (
            {"messages": USER, "top_p": 1.5},
            "invalid_value",
            "top_p",
            "Invalid value for 'top_p': Input should be less than or equal to 1.",
        ),
        (
            {"messages": USER, "stop": ["a", ""]},
            "invalid_value",
            "stop",
            "Invalid value for 'stop': stop sequences must not be empty.",
        ),
        (
            {"messages": USER, "stop": 5},
            "invalid_value",
            "stop",
            "Invalid value for 'stop': stop must be a string or an array of up to 4 strings.",
        ),
        (
            {"messages": USER, "frequency_penalty": -3},
            "invalid_value",
            "frequency_penalty",
            "Invalid value for 'frequency_penalty': Input should be greater than or equal to -2.",
        ),
        (
            {"messages": USER, "response_format": {"type": "json_schema"}},
            "invalid_value",
            "response_format.type",
            "Invalid value for 'response_format.type': Input should be 'text' or 'json_object'.",
        ),
        (
            {"messages": USER, "max_tokens": True},
            "invalid_value",
            "max_tokens",
            "Invalid value for 'max_tokens': Input should be a valid integer.",
        ),
        ({"messages": USER, "n": 0}, "unsupported_value", "n", "Only n=1 is supported by this model."),
        (
            {"messages": USER, "functions": [{"name": "f"}]},
            "unsupported_parameter",
            "functions",
            "'functions' are not supported by this model.",
        ),
    ],
)
def test_a_request_a_text_model_cannot_serve_is_refused_with_openai_codes(
    body: dict[str, Any], code: str, param: str, message: str
) -> None:
    with pytest.raises(ChatRequestError) as caught:
        read_chat_request(body)

    assert (caught.value.code, caught.value.param, caught.value.message) == (code, param, message)


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"presence_penalty": 0.1}, "presence_penalty", "'presence_penalty' is not supported by X models."),
        ({"frequency_penalty": 1}, "frequency_penalty", "'frequency_penalty' is not supported by X models."),
        (
            {"response_format": {"type": "json_object"}},
            "response_format",
            "response_format json_object is not supported by X models.",
        ),
    ],
)
def test_only_plain_sampling_refuses_penalties_and_json_mode(
    extra: dict[str, Any], param: str, message: str
) -> None:
    request = read_chat_request({"messages": USER, **extra})

    with pytest.raises(ChatRequestError) as caught:
        request.only_plain_sampling("X models")

    assert (caught.value.code, caught.value.param, caught.value.message) == (
        "unsupported_parameter",
        param,
        message,
    )


def test_only_plain_sampling_lets_zero_penalties_and_text_format_pass() -> None:
    request = read_chat_request(
        {"messages": USER, "presence_penalty": 0, "response_format": {"type": "text"}}
    )

    assert request.only_plain_sampling("X models") is None


def test_a_completion_serialises_as_openai_s_chat_completion_object() -> None:
    completion = ChatCompletionResponse.answer(
        id="chatcmpl-1", model="m", content="Hi", finish_reason="length", prompt_tokens=3, completion_tokens=2
    ).model_dump()

    created = completion.pop("created")
    assert isinstance(created, int)
    assert list(completion.items()) == [
        ("id", "chatcmpl-1"),
        ("object", "chat.completion"),
        ("model", "m"),
        (
            "choices",
            [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hi", "refusal": None},
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
        ),
        ("usage", {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}),
        ("system_fingerprint", None),
    ]
    assert list(completion["choices"][0]) == ["index", "message", "logprobs", "finish_reason"]


@pytest.mark.parametrize(("value", "read"), [(None, None), (-1, -1), (0, 0), (40, 40)])
def test_vllm_s_top_k_extension_is_read_as_given(value: int | None, read: int | None) -> None:
    extra = {} if value is None else {"top_k": value}

    assert read_chat_request({"messages": USER, **extra}).top_k == read


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (-2, "Input should be greater than or equal to -1"),
        (1.5, "Input should be a valid integer"),
        ("5", "Input should be a valid integer"),
    ],
)
def test_a_top_k_below_minus_one_or_not_an_integer_is_an_invalid_value(value: Any, reason: str) -> None:
    with pytest.raises(ChatRequestError) as caught:
        read_chat_request({"messages": USER, "top_k": value})

    assert (caught.value.code, caught.value.param, caught.value.message) == (
        "invalid_value",
        "top_k",
        f"Invalid value for 'top_k': {reason}.",
    )
