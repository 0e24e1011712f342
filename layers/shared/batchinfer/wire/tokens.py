"""What a token backend takes and gives: the model's limits, resolved sampling parameters, a valid
token request and its result. The wire contract that produces them is `batchinfer.wire.kserve`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_PRIORITY",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_TOP_K",
    "PROMPT_TOKENS_CAP",
    "ModelLimits",
    "SamplingParams",
    "TokenRequest",
    "TokenResult",
]

# MindIE: a prompt never exceeds 1M tokens, whatever the configuration says.
PROMPT_TOKENS_CAP = 1024 * 1024
DEFAULT_TOP_K = 1000  # when the model's generation config has none
DEFAULT_MAX_NEW_TOKENS = 20
DEFAULT_PRIORITY = 5
DEFAULT_TIMEOUT_S = 600


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What a model accepts, from its configuration and its own metadata (None: not checked here,
    e.g. by a client forwarding to a remote server that checks it).

    `vocab_size`: token ids are in [0, vocab_size). `max_seq_len`: prompt + generated tokens (the
    context). `max_position_embeddings`: the trained context. `max_input_tokens`: a configured cap on
    prompts. `max_iter_times`: a configured cap on `max_new_tokens`. `default_top_k`: from the model's
    generation config, else 1000.
    """

    vocab_size: int | None = None
    max_seq_len: int | None = None
    max_position_embeddings: int | None = None
    max_input_tokens: int | None = None
    max_iter_times: int | None = None
    default_top_k: int = DEFAULT_TOP_K

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt in tokens: min(1024*1024, max_input_tokens, max_seq_len - 1,
        max_position_embeddings), ignoring the unknown ones (MindIE's rule)."""
        bounds = [PROMPT_TOKENS_CAP, self.max_input_tokens, self.max_position_embeddings]
        if self.max_seq_len is not None:
            bounds.append(self.max_seq_len - 1)
        return min(b for b in bounds if b is not None)

    def describe_prompt_limit(self) -> str:
        """Where `max_prompt_tokens` comes from, for messages."""
        parts = [f"{PROMPT_TOKENS_CAP}"]
        if self.max_input_tokens is not None:
            parts.append(f"max_input_tokens {self.max_input_tokens}")
        if self.max_seq_len is not None:
            parts.append(f"max_seq_len - 1 = {self.max_seq_len - 1}")
        if self.max_position_embeddings is not None:
            parts.append(f"max_position_embeddings {self.max_position_embeddings}")
        if len(parts) == 1:
            return f"the cap of {PROMPT_TOKENS_CAP} tokens"
        return "the least of " + ", ".join(parts)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Resolved generation parameters (defaults applied, caps enforced).

    `do_sample` False is greedy decoding (temperature/top_k/top_p unused). `seed` None draws a random
    seed. `max_new_tokens` is already capped by `max_iter_times`. `priority` 1 is served first;
    `timeout` is in seconds, counted from submission, waiting included.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = DEFAULT_TOP_K
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    priority: int = DEFAULT_PRIORITY
    timeout: float = float(DEFAULT_TIMEOUT_S)

    def as_parameters(self) -> dict[str, Any]:
        """The KServe `parameters` object stating every value explicitly (for forwarding)."""
        params: dict[str, Any] = {
            "do_sample": self.do_sample,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
            "max_new_tokens": self.max_new_tokens,
            "priority": self.priority,
            "timeout": math.ceil(self.timeout),
        }
        if self.seed is not None:
            params["seed"] = self.seed
        return params


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """A valid token request: its `id` (given or generated), the prompt `input_ids`, the name of the
    requested output and the resolved sampling `params`."""

    id: str
    input_ids: list[int]
    output_name: str
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class TokenResult:
    """Generated token ids; `finish_reason` is `stop` (an end-of-generation token, included as the last
    id) or `length` (max_new_tokens or the context ran out)."""

    ids: list[int]
    finish_reason: Literal["stop", "length"]
