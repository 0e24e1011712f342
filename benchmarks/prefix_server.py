"""A simulated prefix-caching OpenAI-compatible server (vLLM's automatic prefix caching, SGLang's radix
cache): what the shard worker's grouping of sharers (`pipeline.shard.grouping`) saves it.

The server keeps the `capacity` most recently used system prompts (LRU); a request whose system
prompt is cached when it arrives computes only its own tokens, otherwise the system prompt too (and
caches it: sharers arriving while it is computed wait for it, as a radix cache does). Its latency grows
with the uncached prompt tokens (`base_s + per_token_s * uncached`). The batch: `prefixes` system
prompts of about `prefix_tokens` tokens, interleaved (line i uses prompt i mod prefixes), each line a
short review of its own. The worker (`run_requests`, `concurrency` in flight) runs it twice: launched in
input order, and grouped; each run's uncached prompt tokens and seconds.

    .venv/bin/python -m benchmarks.prefix_server
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

WORDS_PER_TOKEN = 1  # the simulated tokenizer: one token per word


class PrefixCachingServer:
    """In-process stand-in of an OpenAI-compatible server with an LRU prefix cache (see the module)."""

    def __init__(self, *, capacity: int, base_s: float, per_token_s: float) -> None:
        self.capacity, self.base_s, self.per_token_s = capacity, base_s, per_token_s
        self.cache: OrderedDict[str, None] = OrderedDict()
        self.uncached = 0
        self.prompt = 0

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """A chat completion of `body` (its first message the system prompt), after the latency of its
        uncached tokens; its usage says how many were cached."""
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        prefix, own = len(system.split()), len(user.split())
        hit = system in self.cache
        if hit:
            self.cache.move_to_end(system)
        else:
            self.cache[system] = None
            while len(self.cache) > self.capacity:
                self.cache.popitem(last=False)
        uncached = own + (0 if hit else prefix)
        self.uncached += uncached
        self.prompt += prefix + own
        await asyncio.sleep(self.base_s + self.per_token_s * uncached)
        return {
            "id": "chatcmpl-sim",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": prefix + own,
                "completion_tokens": 1,
                "total_tokens": prefix + own + 1,
                "prompt_tokens_details": {"cached_tokens": prefix + own - uncached},
            },
        }


def interleaved_batch(n: int, prefixes: int, prefix_tokens: int) -> list[dict[str, Any]]:
    """`n` chat bodies, line i with system prompt i mod `prefixes` (each about `prefix_tokens` words)."""
    systems = [
        f"Rubric {p}: " + "grade the review fairly and briefly " * (prefix_tokens // 6)
        for p in range(prefixes)
    ]
    return [
        {
            "model": "sim",
            "messages": [
                {"role": "system", "content": systems[i % prefixes]},
                {"role": "user", "content": f"Review {i}: it arrived late but works as described, mostly."},
            ],
        }
        for i in range(n)
    ]


def _run(bodies: list[dict[str, Any]], grouped: bool, concurrency: int, server: PrefixCachingServer) -> float:
    from batchinfer.endpoints.registry import ENDPOINTS
    from batchinfer.pipeline.shard import window
    from batchinfer.pipeline.shard.requests import Request

    requests = [Request(i + 1, f"r{i}", body) for i, body in enumerate(bodies)]
    block = window.GROUP_BLOCK
    window.GROUP_BLOCK = block if grouped else 0  # 0: blocks of one request, the input order
    try:
        started = time.perf_counter()
        outcomes = asyncio.run(
            window.run_requests(
                server,  # type: ignore[arg-type]
                requests,
                "batch_prefix_bench",
                endpoint=ENDPOINTS["/v1/chat/completions"],
                concurrency=concurrency,
                time_left_ms=lambda: 10**9,
                reserve_ms=0,
            )
        )
        seconds = time.perf_counter() - started
    finally:
        window.GROUP_BLOCK = block
    assert len(outcomes) == len(requests) and all(o.ok for o in outcomes)
    return seconds


def measure(
    n: int = 64,
    prefixes: int = 4,
    prefix_tokens: int = 600,
    capacity: int = 2,
    concurrency: int = 4,
    base_s: float = 0.002,
    per_token_s: float = 0.00002,
) -> dict[str, Any]:
    """Both orders on fresh servers of the same kind: `{order: {uncached, prompt, seconds}}` for
    "input" and "grouped", and `ratio` (input order's uncached tokens over grouped's)."""
    bodies = interleaved_batch(n, prefixes, prefix_tokens)
    result: dict[str, Any] = {}
    for order in ("input", "grouped"):
        server = PrefixCachingServer(capacity=capacity, base_s=base_s, per_token_s=per_token_s)
        seconds = _run(bodies, order == "grouped", concurrency, server)
        result[order] = {"uncached": server.uncached, "prompt": server.prompt, "seconds": seconds}
    result["ratio"] = result["input"]["uncached"] / result["grouped"]["uncached"]
    return result


if __name__ == "__main__":
    print(measure())
