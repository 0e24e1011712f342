"""Embedded model: completion tokens/s of a 32-request batch end to end through the local stack
(upload, create, prepare, shard worker on the embedded model's continuous-batching engine,
aggregation, polling) against
- the single-sequence path: the same prompts one after another through llama-cpp-python's
  high-level `Llama` (what the embedded backend ran before the engine), and
- the raw batched-decode ceiling (`benchmarks/ceiling.py`: 16 of the prompts prefilled in one
  `llama_decode`, then decoded together, no scheduler), counting the prefill.

All sides decode greedily (temperature 0) with `max_tokens` 64 and the same context settings; the
stack is warmed first with a one-request batch (a warm Lambda, the model loaded), the other two load
their model before their clock starts. They alternate (single, ceiling, stack, single, ceiling,
stack, ...: `rounds` of each) and each side's totals are compared, which evens out the drift of a
noisy machine. The client looks at the batch each time the stack's functions have all returned
(`wait_for`), not on a timer. The single path and the ceiling run in processes of their own: llama.cpp's
OpenMP (libgomp) keeps one thread team per OS thread that ever ran the model, and while two teams exist
in a process both run ~25% slower. Each process sizes its threads by the CPUs it may use.
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

from batchinfer.backends.llama_engine import barrier_wait_environ
from benchmarks.common import REPO, Stopwatch

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 64
N_REQUESTS = 32
CEILING_SEQS = 16
TOPICS = ["copper", "glass", "rubber", "salt", "bamboo", "wool", "granite", "honey", "cotton", "clay"]


def prompts(n: int) -> list[str]:
    """`n` distinct chat prompts of 53 tokens once rendered, whose answers run past `MAX_TOKENS`
    (so every side makes about the ceiling's 64 tokens per request)."""
    return [
        f"Request {i}: describe in detail where {TOPICS[i % len(TOPICS)]} comes from, how it is made "
        f"and what it is used for."
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
    """(completion tokens, seconds) of the prompts through `llama_cpp.Llama` in one loop: the
    single-sequence path."""
    from llama_cpp import Llama

    from batchinfer.backends.config import LlamaCppConfig
    from batchinfer.backends.llama_cpp import find_gguf
    from batchinfer.backends.llama_engine import usable_cpus

    defaults = LlamaCppConfig(backend="llama_cpp")
    llm = Llama(
        model_path=str(find_gguf(defaults.package)),
        n_ctx=defaults.n_ctx,
        n_threads=usable_cpus(),
        n_threads_batch=usable_cpus(),
        flash_attn=False,  # as the engine (exactness)
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


def _subprocess(*args: str) -> dict[str, Any]:
    # llama.cpp's threads wait at barriers as the engine's do (backends/llama_engine.py)
    environ = {**os.environ, **barrier_wait_environ()}
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=environ, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _direct_process(n: int) -> tuple[int, float]:
    result = _subprocess("benchmarks.embedded", "--direct", str(n))
    return result["tokens"], result["seconds"]


def _load() -> float:
    """The run queue's length over the last minute (other work on the machine), from /proc/loadavg."""
    return os.getloadavg()[0]


def measure(n: int = N_REQUESTS, rounds: int = 2) -> dict[str, Any]:
    """`rounds` times (single path, ceiling, stack batch): totals of each side, in tokens/s."""
    texts = prompts(n)
    direct_runs, ceiling_runs, stack_runs, loads = [], [], [], []
    with stack_session() as run:
        for _ in range(rounds):
            loads.append(_load())
            direct_runs.append(_direct_process(n))
            ceiling_runs.append(_subprocess("benchmarks.ceiling", str(CEILING_SEQS), str(MAX_TOKENS)))
            stack_runs.append(run(texts))
    stack_tokens, stack_seconds = map(sum, zip(*stack_runs, strict=True))
    direct_tokens, direct_seconds = map(sum, zip(*direct_runs, strict=True))
    # The ceiling's rate over all rounds: its tokens over its summed time.
    ceiling_seconds = sum(c["new_tokens"] / c["e2e"] for c in ceiling_runs)
    return {
        "n": n,
        "stack_tokens": stack_runs[0][0],
        "stack_seconds": stack_seconds / rounds,
        "stack": stack_tokens / stack_seconds,
        "direct_tokens": direct_runs[0][0],
        "direct": direct_tokens / direct_seconds,
        "ceiling": sum(c["new_tokens"] for c in ceiling_runs) / ceiling_seconds,
        "ceiling_seqs": CEILING_SEQS,
        "stack_runs": [t / s for t, s in stack_runs],
        "direct_runs": [t / s for t, s in direct_runs],
        "ceiling_runs": [(c["e2e"], c["decode"], c["solo_decode"]) for c in ceiling_runs],
        "threads": ceiling_runs[0]["threads"],
        "loads": loads,
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--direct"]:
        tokens, seconds = direct(prompts(int(sys.argv[2])))
        print(json.dumps({"tokens": tokens, "seconds": seconds}))
    else:
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
        print(measure(int(os.environ.get("N", str(N_REQUESTS))), int(os.environ.get("ROUNDS", "2"))))
