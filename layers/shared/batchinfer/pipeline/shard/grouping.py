"""The order a window launches its requests in: those that start with the same prompt text together,
so a model's prefix cache (the embedded engine's, vLLM's, SGLang's) computes the shared prefix once
and its sharers run while it is still cached. Results stay in input order (each request keeps its
index); only the launch order changes.

Grouping is by a key of the request's leading prompt text (`prefix_key`) within blocks of
consecutive requests (`grouped_order`): a window cut short (a checkpoint, the deadline) commits the
outcomes up to its first request not run, so a launch order far from the input order would have
finished requests run again; within a block, at most that block's requests are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from batchinfer.pipeline.shard.requests import Request

__all__ = ["PREFIX_CHARS", "grouped_order", "prefix_key"]

# How much of the leading prompt text makes the key: about 250 tokens, the size of prefix worth sharing.
PREFIX_CHARS = 1000


def prefix_key(body: dict[str, Any]) -> str:
    """The first `PREFIX_CHARS` characters of what a body's prompt starts with: chat's and Anthropic's
    `system` and `messages`, completions' `prompt`, Responses' `instructions` and `input`, a token
    line's `inputs` (JSON, in that order); "" for a body with none of them."""
    parts = [
        body[name]
        for name in ("system", "instructions", "messages", "prompt", "input", "inputs")
        if name in body
    ]
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":"))[:PREFIX_CHARS] if parts else ""


def grouped_order(requests: Sequence[Request], block: int) -> list[int]:
    """Indices of `requests` in launch order: within each run of `block` consecutive requests, the
    requests of one `prefix_key` together, groups in the order they first appear, each in input order
    (so index 0 stays first)."""
    order: list[int] = []
    for start in range(0, len(requests), max(1, block)):
        groups: dict[str, list[int]] = {}
        for index in range(start, min(start + max(1, block), len(requests))):
            groups.setdefault(prefix_key(requests[index].body), []).append(index)
        for indices in groups.values():
            order += indices
    return order
