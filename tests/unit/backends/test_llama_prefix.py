"""Which KV stream a prompt takes its leading tokens from (`batchinfer.backends.llama_prefix`)."""

from __future__ import annotations

from batchinfer.backends.llama_prefix import Source, StreamContents, common_prefix

SYSTEM = list(range(100, 300))  # 200 tokens


def test_common_prefix_counts_shared_leading_tokens_up_to_a_limit() -> None:
    assert common_prefix([*SYSTEM, 1, 2], [*SYSTEM, 1, 3]) == 201
    assert common_prefix(SYSTEM, [*SYSTEM, 5]) == 200
    assert common_prefix([*SYSTEM, 1, 2], [*SYSTEM, 1, 2], limit=150) == 150
    assert common_prefix([7, *SYSTEM], SYSTEM) == 0
    assert common_prefix([], SYSTEM) == 0


def test_a_free_slot_holding_the_prefix_is_taken_in_place_and_an_unrelated_one_kept() -> None:
    # Given slots 0..3 free: 1 holds the system prompt, 2 an unrelated prompt, 0 and 3 nothing
    streams = StreamContents(4)
    streams.hold(1, [*SYSTEM, 1, 2, 3], 203, growing=False)
    streams.hold(2, list(range(500, 700)), 200, growing=False)

    # Then a sharer takes slot 1 (index 1 in the free list) with the 200 shared tokens
    assert streams.choose_free([*SYSTEM, 9, 9, 9], [0, 1, 2, 3]) == (1, 200)
    # and a stranger an empty slot (the last in the list), not the unrelated prompt's
    assert streams.choose_free([1, 2, 3, 4], [0, 1, 2, 3]) == (3, 0)
    # with no empty slot, the shortest stranger is evicted, nothing reused
    assert streams.choose_free([1, 2, 3, 4], [1, 2]) == (1, 0)
    # never the prompt's last 2 tokens, nor fewer than 8
    assert streams.choose_free([*SYSTEM, 1, 2, 3], [1]) == (0, 201)
    assert streams.choose_free(SYSTEM[:9], [1]) == (0, 0)


def test_the_longest_held_prefix_is_the_source_and_a_sharer_waits_for_one_still_prefilling() -> None:
    streams = StreamContents(3)
    prompt = [*SYSTEM, 1, 2, 3]
    streams.hold(0, SYSTEM[:120], 120, growing=False)  # a free slot with part of it
    streams.hold(1, [*SYSTEM, 7, 7], 150, growing=True)  # a running prompt, 150 tokens in so far

    # Then stream 1 is the source (150 tokens now) and the sharer is blocked: 200 will be there
    assert streams.best_source(prompt, 2, 0) == Source(1, 150, 1)
    # Once stream 1 holds its whole prompt the sharer is no longer blocked
    streams.hold(1, [*SYSTEM, 7, 7], 202, growing=False)
    assert streams.best_source(prompt, 2, 0) == Source(1, 200)
    # A stream holding no more than the sequence has already is no source
    assert streams.best_source(prompt, 2, 200) is None
    assert streams.best_source(prompt, 2, 195) is None  # 5 more tokens: less than a copy is worth
