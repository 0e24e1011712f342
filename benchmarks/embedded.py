"""Embedded model: generated tokens/s of a 50-request batch end to end through the local stack
(upload, create, prepare, shard worker on the embedded llama.cpp model, aggregation, polling) against
the same 50 prompts run directly through llama.cpp in one loop.

Both sides decode greedily (temperature 0) with the same sampler settings and `max_tokens`, so they
generate the same tokens; the stack is warmed first with a one-request batch (a warm Lambda, the
model loaded), the direct loop loads its model before its clock starts. Stack batches and direct
loops alternate (direct, stack, direct, ..., direct: `rounds` stack batches) and each side's totals
are compared, which evens out the drift of a noisy machine. The client looks at the batch each time
the stack's functions have all returned (`wait_for`), not on a timer. The direct loop runs in a
process of its own: llama.cpp's OpenMP (libgomp) keeps one thread team per OS thread that ever ran
the model, and while two teams exist in a process both run ~25% slower (the stack runs the model on
its backend's own thread, as a Lambda does).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, Stopwatch

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 48
TOPICS = ["copper", "glass", "rubber", "salt", "bamboo", "wool", "granite", "honey", "cotton", "clay"]


def prompts(n: int) -> list[str]:
    return [
        f"Request {i}: name three everyday uses of {TOPICS[i % len(TOPICS)]}, in one sentence."
        for i in range(n)
    ]


def body(prompt: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "seed": 7,
        "messages": [{"role": "user", "content": prompt}],
    }


def direct(texts: list[str]) -> tuple[int, float]:
    """(completion tokens, seconds) of the prompts through `llama_cpp.Llama` in one loop."""
    from llama_cpp import Llama

    from batchinfer.backends.config import LlamaCppConfig
    from batchinfer.backends.llama_cpp import _usable_cpus, find_gguf

    defaults = LlamaCppConfig(backend="llama_cpp", n_ctx=2048)
    llm = Llama(
        model_path=str(find_gguf(defaults.package)),
        n_ctx=defaults.n_ctx,
        n_threads=_usable_cpus(),
        verbose=False,
    )
    tokens = 0
    with Stopwatch() as watch:
        for text in texts:
            llm.reset()  # the backend does too: no KV cache reuse between requests
            out = llm.create_chat_completion(
                messages=[{"role": "user", "content": text}],
                max_tokens=MAX_TOKENS,
                temperature=0,
                top_k=defaults.top_k,
                min_p=defaults.min_p,
                seed=7,
            )
            tokens += out["usage"]["completion_tokens"]
    del llm
    return tokens, watch.seconds


def wait_for(stack: Any, client: Any, batch_id: str, timeout_s: float = 1200) -> dict[str, Any]:
    """The terminal Batch object, retrieved through the HTTP API each time the stack's functions have
    all returned since the last look (an in-process signal: a remote client would poll). Polling once
    a second would add half a second per batch, and polling faster takes CPU from the model."""
    from batchinfer_local.client import TERMINAL

    deadline = time.monotonic() + timeout_s
    seen = -1
    while time.monotonic() < deadline:
        if stack.activity.busy == 0 and stack.activity.generation != seen:
            batch = client.retrieve(batch_id)
            if batch["status"] in TERMINAL:
                return batch
            seen = stack.activity.generation  # this retrieve was an invocation too
        time.sleep(0.02)
    raise TimeoutError(f"batch {batch_id} not done after {timeout_s:.0f} s")


@contextmanager
def stack_session() -> Iterator[Callable[[list[str]], tuple[int, float]]]:
    """A warm local stack; yields `run(texts) -> (completion tokens, seconds from upload to the
    downloaded output)` for a batch of those prompts."""
    from batchinfer_local import LocalStack
    from batchinfer_local.client import BatchClient
    from benchmarks.common import quiet_functions

    quiet_functions()
    names = itertools.count()

    def batch(client: BatchClient, directory: Path, lines: list[str]) -> int:
        name = f"batch{next(names)}"
        path = directory / f"{name}.jsonl"
        path.write_text(
            "".join(
                json.dumps(
                    {
                        "custom_id": f"{name}-{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": body(text),
                    }
                )
                + "\n"
                for i, text in enumerate(lines)
            )
        )
        created = client.create(client.upload(path)["id"])
        done = wait_for(stack, client, created["id"])
        assert done["status"] == "completed" and done["request_counts"]["failed"] == 0, done
        output = [json.loads(line) for line in client.content(done["output_file_id"]).splitlines()]
        return sum(o["response"]["body"]["usage"]["completion_tokens"] for o in output)

    with tempfile.TemporaryDirectory() as tmp, LocalStack(port=0) as stack:
        client = BatchClient(f"{stack.base_url}/v1", api_key=stack.api_key, timeout=120)
        batch(client, Path(tmp), ["Say hello."])  # a warm worker: the model is loaded

        def run(texts: list[str]) -> tuple[int, float]:
            with Stopwatch() as watch:
                tokens = batch(client, Path(tmp), texts)
            return tokens, watch.seconds

        yield run


def _direct_process(n: int) -> tuple[int, float]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.embedded", "--direct", str(n)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    tokens, seconds = json.loads(done.stdout.strip().splitlines()[-1])
    return tokens, seconds


def measure(n: int = 50, rounds: int = 2) -> dict[str, Any]:
    """Direct loop, then `rounds` times (stack batch, direct loop): totals of each side."""
    texts = prompts(n)
    direct_runs = [_direct_process(n)]
    stack_runs = []
    with stack_session() as run:
        for _ in range(rounds):
            stack_runs.append(run(texts))
            direct_runs.append(_direct_process(n))
    stack_tokens, stack_seconds = map(sum, zip(*stack_runs, strict=True))
    direct_tokens, direct_seconds = map(sum, zip(*direct_runs, strict=True))
    return {
        "n": n,
        "stack_tokens": stack_runs[0][0],
        "stack_seconds": stack_seconds / rounds,
        "stack": stack_tokens / stack_seconds,
        "direct_tokens": direct_runs[0][0],
        "direct": direct_tokens / direct_seconds,
        "stack_runs": [t / s for t, s in stack_runs],
        "direct_runs": [t / s for t, s in direct_runs],
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--direct"]:
        print(json.dumps(direct(prompts(int(sys.argv[2])))))
    else:
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
        print(measure(int(os.environ.get("N", "50"))))
