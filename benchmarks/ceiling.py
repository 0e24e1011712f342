"""The raw batched-decode ceiling of the embedded model: llama.cpp alone, no scheduler, no pipeline.

`seqs` (16) of the embedded benchmark's chat prompts (rendered with the GGUF's chat template, 53
tokens each) are prefilled in ONE `llama_decode` call, then decoded together, one token per sequence
per call, greedy, ignoring end-of-generation so that each makes exactly `new` (64) tokens. The context
is the engine's (`batchinfer.backends.llama_engine`): one KV stream of 2048 cells per sequence
(`kv_unified = false`), flash attention off, threads from the CPUs this process may use. Time starts
at the prefill call (the model and context are loaded and warmed before).

    .venv/bin/python -m benchmarks.ceiling [seqs] [new]     # prints one JSON object

Prints `decode` (tokens/s of the decode calls: seqs x (new - 1) tokens; the first token of each
sequence comes from the prefill) and `e2e` (seqs x new tokens / the time from the prefill call to the
last token), and `solo_decode`, one sequence alone decoded the same way.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import llama_cpp
from llama_cpp import _internals as internals
from llama_cpp._logger import set_verbose

from batchinfer.backends.config import LlamaCppConfig
from batchinfer.backends.llama_cpp import chat_formatter, find_gguf
from batchinfer.backends.llama_engine import usable_cpus
from benchmarks.embedded import prompts

N_CTX = 2048  # per sequence, as the registry's model


def _context(model: internals.LlamaModel, seqs: int, n_batch: int) -> internals.LlamaContext:
    params = internals.LlamaContext.default_params()
    params.n_ctx = N_CTX * seqs
    params.n_seq_max = seqs
    params.n_batch, params.n_ubatch = n_batch, 512
    params.n_threads = params.n_threads_batch = usable_cpus()
    params.kv_unified = False
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.no_perf = True
    return internals.LlamaContext(model=model, params=params, verbose=False)


def _run(context: internals.LlamaContext, prompt_ids: list[list[int]], new: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of the prompts prefilled in one call, then `new - 1` steps."""
    llama_cpp.llama_memory_clear(context.memory, True)
    seqs = len(prompt_ids)
    batch = internals.LlamaBatch(
        n_tokens=max(sum(map(len, prompt_ids)), seqs), embd=0, n_seq_max=1, verbose=False
    )
    samplers = [internals.LlamaSampler() for _ in range(seqs)]
    for sampler in samplers:
        sampler.add_greedy()
    raw, last, n = batch.batch, [], 0
    for seq, ids in enumerate(prompt_ids):
        for position, token in enumerate(ids):
            raw.token[n], raw.pos[n], raw.n_seq_id[n], raw.seq_id[n][0] = token, position, 1, seq
            raw.logits[n] = position == len(ids) - 1
            n += 1
        last.append(n - 1)
    raw.n_tokens = n
    start = time.perf_counter()
    context.decode(batch)
    tokens = [samplers[seq].sample(context, last[seq]) for seq in range(seqs)]
    prefilled = time.perf_counter()
    positions = [len(ids) for ids in prompt_ids]
    for _ in range(new - 1):
        for seq in range(seqs):
            raw.token[seq], raw.pos[seq], raw.n_seq_id[seq], raw.seq_id[seq][0] = (
                tokens[seq],
                positions[seq],
                1,
                seq,
            )
            raw.logits[seq] = True
            positions[seq] += 1
        raw.n_tokens = seqs
        context.decode(batch)
        tokens = [samplers[seq].sample(context, seq) for seq in range(seqs)]
    done = time.perf_counter()
    for sampler in samplers:
        sampler.close()
    return prefilled - start, done - prefilled


def measure(seqs: int = 16, new: int = 64) -> dict[str, Any]:
    """The ceiling's figures (see the module docstring), in tokens/s."""
    set_verbose(False)
    llama_cpp.llama_backend_init()
    path = find_gguf(LlamaCppConfig(backend="llama_cpp").package)
    model = internals.LlamaModel(
        path_model=str(path), params=internals.LlamaModel.default_params(), verbose=False
    )
    formatter = chat_formatter(model)
    prompt_ids = [
        model.tokenize(formatter(messages=[{"role": "user", "content": text}]).prompt.encode(), False, True)
        for text in prompts(seqs)
    ]
    context = _context(model, seqs, n_batch=max(512, sum(map(len, prompt_ids))))
    _run(context, prompt_ids[:1], 8)  # warm-up
    prefill, decode = _run(context, prompt_ids, new)
    _, solo = _run(context, prompt_ids[:1], new)
    return {
        "seqs": seqs,
        "prompt_tokens": sum(map(len, prompt_ids)),
        "new_tokens": seqs * new,
        "threads": usable_cpus(),
        "decode": seqs * (new - 1) / decode,
        "e2e": seqs * new / (prefill + decode),
        "solo_decode": (new - 1) / solo,
    }


if __name__ == "__main__":
    print(json.dumps(measure(*map(int, sys.argv[1:3]))))
