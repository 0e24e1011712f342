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


def test_the_report_gives_the_ratio_and_the_cached_tokens_against_the_prompt_computed_once() -> None:
    # Given a measured result (the committed run's figures)
    result = {
        "n": 32,
        "shared": {
            "seconds": 71.5,
            "prompt_tokens": 22_079,
            "cached_tokens": 20_716,
            "lines_cached": 31,
            "per_line": [(0, 1), (668, 23), (669, 8)],
        },
        "unshared": {
            "seconds": 327.5,
            "prompt_tokens": 22_184,
            "cached_tokens": 0,
            "lines_cached": 0,
            "per_line": [(0, 32)],
        },
        "ratio": 327.5 / 71.5,
        "common": 668,
        "ideal_skip": 20_731,
        "unshared_common": 3,
        "loads": [5.7, 8.4, 10.2],
    }
    rows, notes = [], []

    # When it is reported
    shared_prefix.report(result, rows, notes)

    # Then
    figure = "shared prefix: 32-request batch on the embedded model through the local stack"
    assert [row.cells() for row in rows] == [
        [
            f"{figure}, one ~668-token system prompt vs each line's own (create to completed)",
            "71.5 s",
            "327.5 s (unshareable)",
            "4.580",
            ">= 4",
            "yes",
        ],
        [
            f"{figure}: the batch's cached_tokens vs 31 x the 668 tokens all its prompts share (the system "
            "prompt computed once)",
            "20,716 tokens",
            "20,708 tokens",
            "1.000",
            ">= 1, <= 1.0011 (every earlier prompt cached)",
            "yes",
        ],
    ]
    assert notes == [
        "shared_prefix (load average before each batch and after the last 5.7, 8.4, 10.2): shared: 22,079 "
        "prompt tokens, 20,716 cached (31 of 32 lines; cached tokens x lines 0 x 1, 668 x 23, 669 x 8; "
        "20,731 if every earlier prompt were cached), so 1,363 computed; unshareable: 22,184 prompt tokens, "
        "0 cached (0 lines; its prompts share 3 tokens); the unshareable batch's prompt tokens minus those "
        "the shared batch computed: 20,821 (its system prompts are 105 tokens longer in all)"
    ]
