"""What the llama.cpp engine (`batchinfer.backends.llama_engine`, which re-exports them) hands back:
a request's `Generation`, an `EngineState` snapshot, the `EngineTimeout` error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["EngineState", "EngineTimeout", "Generation"]


class EngineTimeout(Exception):
    """A request's deadline passed; `started` says whether it had a sequence (else it was waiting)."""

    def __init__(self, started: bool) -> None:
        super().__init__("running" if started else "waiting for the model")
        self.started = started


@dataclass(frozen=True, slots=True)
class Generation:
    """What a request generated: `tokens` (ids; the end-of-generation id last when the request asked for
    it), `text` (the tokens' bytes, cut before the first stop string; special tokens render as
    nothing), `finish_reason`: "stop" (end of generation or a stop string), "length" (the cap), and
    `cached_tokens`: the prompt's leading tokens taken from a KV stream instead of computed."""

    tokens: list[int]
    text: bytes
    finish_reason: Literal["stop", "length"]
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EngineState:
    """A snapshot of the engine: requests `running` (holding a sequence) and `waiting`, `free`
    sequences, `steps` (llama_decode calls so far)."""

    running: int
    waiting: int
    free: int
    steps: int
