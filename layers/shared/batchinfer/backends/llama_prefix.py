"""What each KV stream of the llama.cpp engine holds, so a prompt's leading tokens are computed once.

`LlamaEngine` (`batchinfer.backends.llama_engine`) gives each sequence its own KV stream. A stream
holds the tokens at positions 0..n_kv-1 of one token list: the prompt being prefilled or generated
after (a running sequence), or the prompt of a sequence that finished (a free slot keeps it until
another request needs the slot: the cache of recent prefixes). A new prompt that starts with tokens
some stream holds takes them instead of computing them: in place when it is given that free slot, or
copied from another stream (`llama_memory_seq_cp`, then the cells past the shared prefix removed).

Copies between streams (`kv_unified = false`) copy the whole stream buffer, whatever the positions
asked (llama.cpp asserts "seq_cp() is only supported for full KV buffers"): 45 MiB for SmolLM2's
2048 cells, measured at about 8 ms of CPU, what prefilling one prompt token costs. So a copy is
made only when it saves at least `MIN_REUSE` tokens. Measured with the pinned llama.cpp: the logits
after a copied or kept prefix equal those of the whole prompt computed in one stream, bit for bit
(prefix computed in chunks of 100 or 512 tokens, copied or kept in place).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["COMPUTED_TAIL", "MIN_REUSE", "Source", "StreamContents", "common_prefix"]

MIN_REUSE = 8
# At least the prompt's last 2 tokens are computed: its last for its logits, and a 1-token chunk past
# position 0 is attended as one row, which llama.cpp's CPU kernels do not compute bit-exactly like
# the same token in a longer chunk (measured: logits off by up to 0.67).
COMPUTED_TAIL = 2
_STRIDE = 64


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """How many leading tokens `a` and `b` share, at most `limit` (default: no limit)."""
    n = min(len(a), len(b), len(a) if limit is None else limit)
    start = 0
    while start + _STRIDE <= n and a[start : start + _STRIDE] == b[start : start + _STRIDE]:
        start += _STRIDE  # whole strides compared by list equality, in C
    while start < n and a[start] == b[start]:
        start += 1
    return start


@dataclass(frozen=True, slots=True)
class Source:
    """The stream to take a prompt's prefix from: `seq_id`, the `length` it holds of the prompt now,
    and `blocked_by`: a stream ahead of this one still prefilling tokens the prompt shares (better wait
    for it than compute them twice), else None."""

    seq_id: int
    length: int
    blocked_by: int | None = None


class StreamContents:
    """Per sequence id: the token list its KV stream holds the first `n_kv` tokens of, whether those
    are still growing (a running prompt being prefilled), and when a free slot was last filled.

    Used by the engine's thread only (and under the engine's lock where admission reads it)."""

    def __init__(self, n_seq_max: int) -> None:
        self.tokens: list[Sequence[int]] = [[] for _ in range(n_seq_max)]
        self.n_kv = [0] * n_seq_max
        self.growing = [False] * n_seq_max
        self._stamps = [0] * n_seq_max
        self._clock = 0

    def hold(self, seq_id: int, tokens: Sequence[int], n_kv: int, *, growing: bool) -> None:
        """Record that stream `seq_id` holds `tokens[:n_kv]` (at positions 0..n_kv-1)."""
        self.tokens[seq_id], self.n_kv[seq_id], self.growing[seq_id] = tokens, n_kv, growing
        self._clock += 1
        self._stamps[seq_id] = self._clock

    def clear(self, seq_id: int) -> None:
        """Stream `seq_id` holds nothing."""
        self.hold(seq_id, [], 0, growing=False)

    def held(self, seq_id: int) -> Sequence[int]:
        """The tokens stream `seq_id` holds now."""
        return self.tokens[seq_id][: self.n_kv[seq_id]]

    def choose_free(self, prompt: Sequence[int], free: Sequence[int]) -> tuple[int, int]:
        """The index in `free` (free sequence ids) of the slot for `prompt`, and how many of the
        prompt's tokens it holds already (0, or at least `MIN_REUSE`; never the prompt's last 2 tokens:
        `COMPUTED_TAIL`).

        A slot's score is what it saves minus what it throws away (its tokens past the shared prefix),
        so an empty slot (score 0) is taken before a long unrelated prefix is evicted; ties: the least
        recently filled, then the last in `free`.
        """

        def score(index: int) -> tuple[int, int, int]:
            seq_id = free[index]
            shared = common_prefix(prompt, self.held(seq_id), len(prompt) - COMPUTED_TAIL)
            shared = shared if shared >= MIN_REUSE else 0
            return (2 * shared - self.n_kv[seq_id], -self._stamps[seq_id], index)

        best = max(range(len(free)), key=score)
        shared = common_prefix(prompt, self.held(free[best]), len(prompt) - COMPUTED_TAIL)
        return best, shared if shared >= MIN_REUSE else 0

    def best_source(self, prompt: Sequence[int], seq_id: int, n_prefilled: int) -> Source | None:
        """The stream (other than `seq_id`, which holds `prompt[:n_prefilled]`) holding the longest
        prefix of `prompt` beyond `n_prefilled` by at least `MIN_REUSE` tokens, else None; `blocked_by`
        when another stream ahead of this one is still prefilling tokens of the prompt."""
        best: Source | None = None
        blocked_by = None
        for other, tokens in enumerate(self.tokens):
            if other == seq_id or self.n_kv[other] <= n_prefilled:
                continue
            shared = common_prefix(prompt, tokens, len(prompt) - COMPUTED_TAIL)
            if self.growing[other] and shared > self.n_kv[other]:
                blocked_by = other
            length = min(shared, self.n_kv[other])
            if length >= n_prefilled + MIN_REUSE and (best is None or length > best.length):
                best = Source(other, length)
        if best is None:
            return None if blocked_by is None else Source(seq_id, n_prefilled, blocked_by)
        return Source(best.seq_id, best.length, blocked_by)
