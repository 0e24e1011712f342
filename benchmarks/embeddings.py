"""Embeddings: inputs/s of a 2,000-input `/v1/embeddings` batch (one short text a line) end to end
through the local stack (upload, create, prepare, the shard worker on the embedded all-MiniLM-L6-v2,
aggregation, polling) against the raw rate of the same model with the same runtime: the texts
tokenized and packed into decode calls as the engine packs them (`n_seq_max` inputs, `n_batch`
tokens a call, each input at an aligned start), one call after another in a process of its own, no
queue, no pipeline.

The stack is warmed first with a one-line batch (a warm Lambda, the model loaded); the raw side loads
its model before its clock starts. They alternate `rounds` times and each side's totals are compared.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import Stopwatch
from benchmarks.embedded import _load, _subprocess, wait_for

MODEL = "all-minilm-l6-v2"
N_TEXTS = 2000
SUBJECTS = ["the river", "a red kite", "old maps", "fresh bread", "the harbour", "winter light", "a violin"]
VERBS = ["drifts past", "hides behind", "is shaped like", "smells of", "waits under", "outlasts"]


def texts(n: int) -> list[str]:
    """`n` short, distinct sentences (8 to 14 tokens each)."""
    pairs = itertools.cycle(itertools.product(SUBJECTS, VERBS, SUBJECTS))
    return [f"{a} {verb} {b}, note {i}." for i, (a, verb, b) in zip(range(n), pairs, strict=False)]


def raw(inputs: list[str]) -> float:
    """Seconds to embed `inputs` directly on the engine's decode, packed as the engine packs them."""
    from batchinfer.backends.config import LlamaEmbedConfig
    from batchinfer.backends.llama_embed import LlamaEmbedBackend, aligned
    from batchinfer.backends.registry import load_registry

    config = load_registry().config(MODEL)
    assert isinstance(config, LlamaEmbedConfig)
    backend = LlamaEmbedBackend(MODEL, config)
    engine = backend._load()
    with Stopwatch() as watch:
        tokens = [engine.tokenize(text) for text in inputs]
        call: list[list[int]] = []
        for sequence in tokens:
            if call and (
                len(call) == engine.n_seq_max
                or sum(map(aligned, map(len, call))) + aligned(len(sequence)) > engine.n_batch
            ):
                engine._decode(call)
                call = []
            call.append(sequence)
        engine._decode(call)
    return watch.seconds


@contextmanager
def stack_session() -> Iterator[Callable[[list[str]], float]]:
    """A warm local stack; yields `run(texts) -> seconds from upload to the downloaded output`."""
    from batchinfer_local import LocalStack
    from batchinfer_local.client import BatchClient
    from benchmarks.common import quiet_functions

    quiet_functions()
    names = itertools.count()

    def batch(client: BatchClient, directory: Path, lines: list[str]) -> None:
        name = f"embed{next(names)}"
        path = directory / f"{name}.jsonl"
        requests = (
            {"custom_id": f"{name}-{i}", "body": {"model": MODEL, "input": text}}
            for i, text in enumerate(lines)
        )
        path.write_text(
            "".join(json.dumps({**r, "method": "POST", "url": "/v1/embeddings"}) + "\n" for r in requests)
        )
        created = client.create(client.upload(path)["id"], endpoint="/v1/embeddings")
        done = wait_for(stack, client, created["id"])
        assert done["status"] == "completed" and done["request_counts"]["failed"] == 0, done
        assert len(client.content(done["output_file_id"]).splitlines()) == len(lines)

    with tempfile.TemporaryDirectory() as tmp, LocalStack(port=0) as stack:
        client = BatchClient(f"{stack.base_url}/v1", api_key=stack.api_key, timeout=120)
        batch(client, Path(tmp), ["warm up"])

        def run(inputs: list[str]) -> float:
            with Stopwatch() as watch:
                batch(client, Path(tmp), inputs)
            return watch.seconds

        yield run


def measure(n: int = N_TEXTS, rounds: int = 2) -> dict[str, Any]:
    """`rounds` times (raw, stack batch): each side's inputs/s over all rounds."""
    inputs = texts(n)
    raw_runs, stack_runs, loads = [], [], []
    with stack_session() as run:
        for _ in range(rounds):
            loads.append(_load())
            raw_runs.append(_subprocess("benchmarks.embeddings", "--raw", str(n))["seconds"])
            stack_runs.append(run(inputs))
    return {
        "n": n,
        "stack": n * rounds / sum(stack_runs),
        "raw": n * rounds / sum(raw_runs),
        "stack_runs": [n / s for s in stack_runs],
        "raw_runs": [n / s for s in raw_runs],
        "loads": loads,
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--raw"]:
        print(json.dumps({"seconds": raw(texts(int(sys.argv[2])))}))
    else:
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
        print(measure(int(os.environ.get("N", str(N_TEXTS))), int(os.environ.get("ROUNDS", "2"))))
