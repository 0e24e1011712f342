"""Embedded model: generated tokens/s of a 50-request batch end to end through the local stack
(upload, create, prepare, shard worker on the embedded llama.cpp model, aggregation, polling) against
the same 50 prompts run directly through llama.cpp in one loop.

Both sides decode greedily (temperature 0) with the same sampler settings and `max_tokens`, so they
generate the same tokens; the stack is warmed first with a one-request batch (a warm Lambda, the
model loaded), the direct loop loads its model before its clock starts. The direct loop runs before
and after the stack and the mean of the two is the reference, which halves the drift of a noisy
machine.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import Stopwatch

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 48
TOPICS = ["copper", "glass", "rubber", "salt", "bamboo", "wool", "granite", "honey", "cotton", "clay"]


def prompts(n: int) -> list[str]:
    return [f"Request {i}: name three everyday uses of {TOPICS[i % len(TOPICS)]}, in one sentence." for i in range(n)]


def body(prompt: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 7,
            "messages": [{"role": "user", "content": prompt}]}


def direct(texts: list[str]) -> tuple[int, float]:
    """(completion tokens, seconds) of the prompts through `llama_cpp.Llama` in one loop."""
    from llama_cpp import Llama

    from batchinfer.backends.llama_cpp import _usable_cpus, find_gguf
    from batchinfer.backends.registry import LlamaCppConfig

    defaults = LlamaCppConfig(backend="llama_cpp", n_ctx=2048)
    llm = Llama(model_path=str(find_gguf(defaults.package)), n_ctx=defaults.n_ctx, n_threads=_usable_cpus(),
                verbose=False)
    tokens = 0
    with Stopwatch() as watch:
        for text in texts:
            llm.reset()  # the backend does too: no KV cache reuse between requests
            out = llm.create_chat_completion(messages=[{"role": "user", "content": text}], max_tokens=MAX_TOKENS,
                                             temperature=0, top_k=defaults.top_k, min_p=defaults.min_p, seed=7)
            tokens += out["usage"]["completion_tokens"]
    del llm
    return tokens, watch.seconds


def through_stack(texts: list[str]) -> tuple[int, float]:
    """(completion tokens, seconds from upload to the downloaded output) through the local stack."""
    from batchinfer_local import LocalStack
    from batchinfer_local.client import BatchClient
    from benchmarks.common import quiet_functions

    quiet_functions()

    def run(client: BatchClient, directory: Path, lines: list[str], name: str) -> tuple[int, dict[str, Any]]:
        path = directory / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"custom_id": f"{name}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                            "body": body(text)}) + "\n" for i, text in enumerate(lines)))
        batch = client.create(client.upload(path)["id"])
        batch = client.wait(batch["id"], poll_s=0.25, timeout_s=1200)
        assert batch["status"] == "completed" and batch["request_counts"]["failed"] == 0, batch
        output = [json.loads(line) for line in client.content(batch["output_file_id"]).splitlines()]
        return sum(o["response"]["body"]["usage"]["completion_tokens"] for o in output), batch

    with tempfile.TemporaryDirectory() as tmp, LocalStack(port=0) as stack:
        client = BatchClient(f"{stack.base_url}/v1", api_key=stack.api_key, timeout=120)
        run(client, Path(tmp), texts[:1], "warmup")  # a warm worker: the model is loaded
        with Stopwatch() as watch:
            tokens, _ = run(client, Path(tmp), texts, "bench")
    return tokens, watch.seconds


def measure(n: int = 50) -> dict[str, Any]:
    texts = prompts(n)
    first = direct(texts)
    stack = through_stack(texts)
    second = direct(texts)
    reference = (first[0] + second[0]) / (first[1] + second[1])
    return {"n": n, "stack_tokens": stack[0], "stack_seconds": stack[1], "stack": stack[0] / stack[1],
            "direct_tokens": first[0], "direct": reference, "direct_runs": [first[0] / first[1], second[0] / second[1]]}


if __name__ == "__main__":
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    print(measure(int(os.environ.get("N", "50"))))
