"""The launch order of a window's requests: sharers of a prompt's start together (`shard.grouping`)."""

from __future__ import annotations

from typing import Any

from batchinfer.pipeline.shard.grouping import PREFIX_CHARS, grouped_order, prefix_key
from batchinfer.pipeline.shard.requests import Request

RULES = "Grade the review. " * 80  # longer than the key


def chat(system: str, user: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }


def requests(bodies: list[dict[str, Any]]) -> list[Request]:
    return [Request(i + 1, f"r{i}", body) for i, body in enumerate(bodies)]


def test_the_key_is_the_start_of_the_prompt_whatever_the_endpoint() -> None:
    assert prefix_key(chat(RULES, "a")) == prefix_key(chat(RULES, "b"))
    assert len(prefix_key(chat(RULES, "a"))) == PREFIX_CHARS
    assert prefix_key(chat("A" + RULES, "a")) != prefix_key(chat(RULES, "a"))
    assert prefix_key({"model": "m", "prompt": "hello"}) == '["hello"]'
    assert prefix_key({"model": "m", "instructions": "be short", "input": "hi"}) == '["be short","hi"]'
    assert (
        prefix_key({"inputs": [{"name": "input_ids", "data": [1, 2]}]})
        == '[[{"name":"input_ids","data":[1,2]}]]'
    )
    assert prefix_key({"model": "m"}) == ""


def test_sharers_are_launched_together_in_blocks_first_request_first() -> None:
    # Given interleaved sharers of two system prompts and a stranger
    bodies = [
        chat(RULES, "1"),
        chat("Other. " * 200, "2"),
        chat(RULES, "3"),
        chat("x", "4"),
        chat("Other. " * 200, "5"),
    ]

    # Then each group runs together, in order of first appearance, each in input order
    assert grouped_order(requests(bodies), block=10) == [0, 2, 1, 4, 3]
    # within blocks of 2 requests only
    assert grouped_order(requests(bodies), block=2) == [0, 1, 2, 3, 4]
    assert grouped_order(requests(bodies * 2), block=5) == [0, 2, 1, 4, 3, 5, 7, 6, 9, 8]
    assert grouped_order([], block=4) == []
