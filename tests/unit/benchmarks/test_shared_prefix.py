"""The shared-prefix bench's batches (benchmarks/shared_prefix.py), without the model."""

from __future__ import annotations

import json

from benchmarks import shared_prefix


def test_the_shared_batch_repeats_one_system_prompt_before_32_distinct_reviews() -> None:
    # When the shared batch's messages are built
    conversations = shared_prefix.messages(shared=True)

    # Then every line has the rubric as its system prompt and a review of its own
    assert len(conversations) == 32
    assert {c[0]["content"] for c in conversations} == {shared_prefix.RUBRIC}
    assert len({c[1]["content"] for c in conversations}) == 32
    assert conversations[0][1] == {
        "role": "user",
        "content": "Review 1: the kettle works exactly as described and I use it every day.",
    }


def test_the_unshareable_batch_starts_each_system_prompt_with_its_own_word() -> None:
    # When the unshareable batch's messages are built
    conversations = shared_prefix.messages(shared=False)

    # Then the system prompts differ from their first word, the rubric and reviews are the shared batch's
    firsts = [c[0]["content"].split(".")[0] for c in conversations]
    assert firsts[:3] == ["Amber", "Basil", "Cedar"]
    assert len(set(firsts)) == 32
    assert conversations[0][0]["content"] == f"Amber. {shared_prefix.RUBRIC}"
    assert [c[1] for c in conversations] == [c[1] for c in shared_prefix.messages(shared=True)]


def test_each_line_asks_the_embedded_model_for_8_tokens_greedily() -> None:
    # When a batch file is written for two conversations
    text = shared_prefix.batch_lines("b", shared_prefix.messages(2, shared=True))

    # Then
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["custom_id"] for line in lines] == ["b-0", "b-1"]
    assert lines[1]["body"] == {
        "model": "smollm2-135m-instruct",
        "max_tokens": 8,
        "temperature": 0,
        "messages": shared_prefix.messages(2, shared=True)[1],
    }
