"""Continuous batching on llama.cpp: up to N sequences of one GGUF model decoded together in one context.

    engine = LlamaEngine(path, n_ctx=2048, n_seq_max=16, n_threads=2)   # loads; call it off the loop
    sampler = internals.LlamaSampler(); sampler.add_greedy()            # the request's own chain
    out = await engine.generate(prompt_ids, sampler, max_new_tokens=64, stop=[b"\\n\\n"], priority=5)
    out.tokens, out.text, out.finish_reason                              # [ids], b"...", "stop" | "length"
    out.cached_tokens                                    # prompt tokens taken from the KV cache

One llama.cpp context holds `n_seq_max` sequences, each with its own KV cache stream of `n_ctx`
cells (`kv_unified = false`; the context is `n_seq_max * n_ctx` cells). One thread per engine runs
the loop; asyncio callers submit requests and await them. Each step is ONE `llama_decode` of:
  1. one token for every sequence that is generating (the one it sampled last step), then
  2. the next chunk of ONE prompt still being prefilled, up to `n_batch` tokens in all: the
     prefilling sequence of the lowest (priority, waiting for a sharer, prompt tokens still to
     compute, arrival), so a short prompt is not held behind a long one being prefilled in chunks,
     and a long prompt never holds up the sequences generating beside it.
After the call every sequence with logits samples its next token with its own sampler chain
(`llama_sampler_sample(chain, ctx, batch_index)`: its parameters, its own RNG and penalty window),
checks its stop conditions, and a finished sequence frees its KV stream but its prompt. A
waiting request (lowest priority number first, then arrival) takes a free sequence at the start of
the next step: continuous batching.

Exactness (greedy output alone == in any batch; the same seed gives the same output whatever shares
the batch), measured bit for bit on the logits with the pinned llama.cpp (on a prototype of this engine):
each sequence attends only to its own KV stream; flash attention is off (its CPU kernel changes code
path with the step's shape: a tiled kernel from 64 query rows, a KV split across threads once a
batch's KV view reaches 512 cells); at most one prompt is prefilled per call (llama.cpp splits a call
into micro-batches with equal token counts per sequence, and two prompts of unequal length in one
call gave different logits from the same prompts alone). How a prompt is chunked, what else decodes
in the same call, and which sequence id it gets were all measured exact.

Prefix reuse (`batchinfer.backends.llama_prefix`): a prompt whose leading tokens another stream holds
(a running prompt, or a finished one kept in a free slot) takes them, and only the rest is computed;
a sequence that shares a prefix a sequence ahead of it is still prefilling waits for it. Measured
exact too (bit for bit on the logits, in place or copied, whatever chunks computed the prefix).

Timeouts and cancellation: a request past its deadline, or whose awaiting task was cancelled, is
dropped before the next step: a waiting one leaves the queue, a running one frees its sequence.

Why our own code: llama-cpp-python's `Llama` holds one sequence and its server runs one request at
a time; `xllamacpp` (llama.cpp's own server with slots and continuous batching) puts every slot's
pending prompt into one batch, which cannot be configured, so 17 of 32 greedy outputs differed from
their solo outputs when the prompts arrived together; it also ignores priority, has no hard
per-request timeout, no cancel of a request in prefill and no token ids out without logprobs. So the
scheduler is ours, on llama-cpp-python's low-level API and its `_internals` wrappers (`LlamaModel`,
`LlamaContext`, `LlamaBatch`, `LlamaSampler`), whose ctypes signatures follow its vendored
llama.cpp: re-check this module (and its exactness tests) at every llama-cpp-python bump.
Not done: preempting a running sequence for a higher priority one, n > 1.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from batchinfer.backends.base import RequestNotStarted
from batchinfer.backends.llama_prefix import Source, StreamContents
from batchinfer.backends.llama_results import EngineState, EngineTimeout, Generation
from batchinfer.backends.llama_threads import barrier_wait_environ, usable_cpus

if TYPE_CHECKING:  # llama-cpp-python is imported where used: the zip functions' layer does not ship it
    from llama_cpp import _internals as internals

__all__ = ["EngineState", "EngineTimeout", "Generation", "LlamaEngine", "barrier_wait_environ", "usable_cpus"]

DEFAULT_PRIORITY = 5
# Tokens per llama_decode call (llama.cpp's default n_batch): the generating sequences' tokens plus
# one prompt chunk. A longer prompt is prefilled over several calls.
N_BATCH = 512


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    sampler: internals.LlamaSampler
    max_new_tokens: int
    stop: list[bytes]
    include_eog: bool
    priority: int
    deadline: float | None  # time.monotonic() seconds
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    arrival: int = 0
    cancelled: bool = False  # set by the caller's thread, read by the engine's
    started: bool = False

    def resolve(self, result: Generation | None = None, error: BaseException | None = None) -> None:
        """Hand the outcome to the awaiting coroutine (from the engine's thread)."""

        def deliver() -> None:
            if not self.future.done():
                if error is not None:
                    self.future.set_exception(error)
                else:
                    self.future.set_result(result)  # type: ignore[arg-type]

        try:
            self.loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # that event loop is closed: nobody waits any more
            pass


@dataclass(eq=False)
class _Sequence:
    request: _Request
    seq_id: int
    n_prefilled: int = 0  # prompt tokens in the KV cache
    cached: int = 0  # of them, taken from a KV stream instead of computed
    tokens: list[int] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    logits_index: int = -1  # this step's batch index of its logits, -1: none

    @property
    def to_prefill(self) -> int:
        return len(self.request.prompt) - self.n_prefilled

    def source(self, streams: StreamContents) -> Source | None:
        """Where it can take more of its prompt from (`StreamContents.best_source`)."""
        return streams.best_source(self.request.prompt, self.seq_id, self.n_prefilled)

    def prefill_order(self, source: Source | None) -> tuple[int, int, int]:
        """(priority, prompt tokens left to compute after what it can take from `source`, arrival)."""
        length = self.n_prefilled if source is None else source.length
        return (self.request.priority, len(self.request.prompt) - length, self.request.arrival)


class LlamaEngine:
    """Continuous batching of requests over one llama.cpp context (see the module docstring).

    Loading is synchronous (about 0.3 s for a 100 MB GGUF plus the KV cache of
    `n_seq_max * n_ctx` cells: 23 KB per cell for SmolLM2-135M, so 0.75 GB at 16 x 2048); call it
    off the event loop. Raises `ValueError` when llama.cpp cannot load the file or create the
    context. The loop thread starts at once and is a daemon: a process may exit mid-generation.
    `model` (the `LlamaModel`) tokenizes, detokenizes and reads metadata from any thread.
    `prefix_reuse` (settable while running; read at each admission and prefill): take a prompt's
    leading tokens from a KV stream that holds them (see `batchinfer.backends.llama_prefix`).
    """

    def __init__(
        self, path: Path, *, n_ctx: int, n_seq_max: int, n_threads: int, prefix_reuse: bool = True
    ) -> None:
        if not 1 <= n_seq_max < N_BATCH:
            raise ValueError(f"n_seq_max must be in [1, {N_BATCH}), got {n_seq_max}")
        os.environ.update(barrier_wait_environ())  # libgomp reads them once, when llama.cpp loads
        import llama_cpp
        from llama_cpp import _internals as internals
        from llama_cpp._logger import set_verbose

        set_verbose(False)  # llama.cpp's load and context logs go to stderr otherwise
        llama_cpp.llama_backend_init()
        self.model = internals.LlamaModel(
            path_model=str(path), params=internals.LlamaModel.default_params(), verbose=False
        )
        params = internals.LlamaContext.default_params()
        params.n_ctx = n_ctx * n_seq_max
        params.n_seq_max = n_seq_max
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_threads = params.n_threads_batch = n_threads
        params.kv_unified = False  # a KV stream per sequence (exactness, see the module docstring)
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # (ditto)
        params.no_perf = True
        self._context = internals.LlamaContext(model=self.model, params=params, verbose=False)
        self.n_seq_max = n_seq_max
        # llama.cpp may round the context; each sequence's stream is what it allocated, at most n_ctx.
        self.n_ctx = min(n_ctx, llama_cpp.llama_n_ctx(self._context.ctx) // n_seq_max)
        self.n_threads = n_threads
        self._batch = internals.LlamaBatch(n_tokens=N_BATCH, embd=0, n_seq_max=1, verbose=False)
        self._cv = threading.Condition()
        self._waiting: list[tuple[int, int, _Request]] = []  # a heap of (priority, arrival, request)
        self._arrivals = itertools.count()
        self._free = list(range(n_seq_max - 1, -1, -1))
        self._running: list[_Sequence] = []  # the engine thread's only
        self._streams = StreamContents(n_seq_max)
        self.prefix_reuse = prefix_reuse
        self._steps = 0
        self._thread = threading.Thread(target=self._run, name=f"llama-engine-{path.stem}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """False once the loop thread has died (a bug): the owner should build a new engine."""
        return self._thread.is_alive()

    def state(self) -> EngineState:
        """The current `EngineState` (thread-safe)."""
        with self._cv:
            return EngineState(
                running=self.n_seq_max - len(self._free),
                waiting=sum(1 for _, _, r in self._waiting if not r.cancelled),
                free=len(self._free),
                steps=self._steps,
            )

    async def generate(
        self,
        prompt: Sequence[int],
        sampler: internals.LlamaSampler,
        *,
        max_new_tokens: int,
        stop: Sequence[bytes] = (),
        include_eog: bool = False,
        priority: int = DEFAULT_PRIORITY,
        timeout: float | None = None,
    ) -> Generation:
        """Generate after `prompt` (token ids, 1 to n_ctx - 1 of them, each in [0, n_vocab): the caller
        checks) with `sampler`, the request's own llama.cpp sampler chain (built and primed by the
        caller; the engine samples with it and then closes it).

        Stops at an end-of-generation token (kept last in `tokens` with `include_eog`), at the first of
        the `stop` byte strings in the text (cut before it), or after `max_new_tokens` tokens, which is
        capped by the room left in the sequence's context (n_ctx - len(prompt)). `priority` (1 first)
        orders admission while all sequences are busy; `timeout` seconds count from now, waiting
        included. Raises `EngineTimeout` past the timeout, `RuntimeError` when llama.cpp fails
        (`llama_decode returned <n>`, or the engine stopped). Cancelling the awaiting task frees the
        request's place in the queue or its sequence before the next step.
        """
        loop = asyncio.get_running_loop()
        request = _Request(
            prompt=list(prompt),
            sampler=sampler,
            max_new_tokens=min(max_new_tokens, self.n_ctx - len(prompt)),
            stop=list(stop),
            include_eog=include_eog,
            priority=priority,
            deadline=None if timeout is None else time.monotonic() + timeout,
            loop=loop,
            future=loop.create_future(),
        )
        with self._cv:
            if not self.alive:
                raise RuntimeError("the llama.cpp engine has stopped")
            request.arrival = next(self._arrivals)
            heapq.heappush(self._waiting, (priority, request.arrival, request))
            self._cv.notify()
        try:
            if timeout is None:
                return await request.future
            # The engine drops the request at its deadline; this only guards against a stuck step.
            async with asyncio.timeout(timeout + 5.0):
                return await request.future
        except TimeoutError:
            self._cancel(request)
            raise EngineTimeout(request.started) from None
        except asyncio.CancelledError:
            self._cancel(request)
            raise

    def withdraw_waiting(self) -> int:
        """Give back every request still waiting for a sequence (the shard worker's batch is ending, or
        they could not finish before its deadline): each raises `RequestNotStarted` in its caller;
        the running ones go on. Returns how many were waiting."""
        with self._cv:
            waiting, self._waiting = self._waiting, []
            for _, _, request in waiting:
                request.sampler.close()
                if not request.cancelled:
                    request.resolve(error=RequestNotStarted())
            self._cv.notify()
        return sum(1 for _, _, request in waiting if not request.cancelled)

    def _cancel(self, request: _Request) -> None:
        with self._cv:
            request.cancelled = True
            self._cv.notify()

    # ------------------------------------------------------------------ the engine's thread

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._waiting and not self._running:
                        self._cv.wait()
                    admitted = self._admit()
                for sequence in admitted:
                    self._start(sequence)
                self._drop_finished_callers()
                if self._running:
                    self._step()
        except BaseException as exc:  # a bug: fail everything pending rather than hang it
            error = RuntimeError(f"the llama.cpp engine stopped: {type(exc).__name__}: {exc}")
            for sequence in list(self._running):
                self._finish(sequence, error=error)
            with self._cv:
                for _, _, request in self._waiting:
                    request.resolve(error=error)
                self._waiting.clear()
            raise

    def _admit(self) -> list[_Sequence]:
        """Waiting requests into free sequences, lowest (priority, arrival) first (holding _cv)."""
        now = time.monotonic()
        admitted = []
        while self._waiting and self._free:
            _, _, request = heapq.heappop(self._waiting)
            if request.cancelled:
                request.sampler.close()
            elif request.deadline is not None and now >= request.deadline:
                request.sampler.close()
                request.resolve(error=EngineTimeout(started=False))
            else:
                request.started = True
                index, kept = (
                    self._streams.choose_free(request.prompt, self._free)
                    if self.prefix_reuse
                    else (len(self._free) - 1, 0)
                )
                seq_id = self._free.pop(index)
                admitted.append(_Sequence(request, seq_id, n_prefilled=kept, cached=kept))
        return admitted

    def _start(self, sequence: _Sequence) -> None:
        """Its stream keeps the prefix it shares with the prompt it held (`n_prefilled`), or nothing."""
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(self._context.memory, sequence.seq_id, sequence.n_prefilled, -1)
        self._hold(sequence)
        self._running.append(sequence)

    def _hold(self, sequence: _Sequence) -> None:
        growing = sequence.to_prefill > 0
        self._streams.hold(sequence.seq_id, sequence.request.prompt, sequence.n_prefilled, growing=growing)

    def _reuse(self, sequence: _Sequence) -> None:
        """Copy into its stream the longest prefix of its prompt another stream holds (when that saves
        at least `MIN_REUSE` tokens): llama.cpp copies the whole stream at the next decode, then the
        cells past the prefix are dropped."""
        import llama_cpp

        source, memory = sequence.source(self._streams), self._context.memory
        if source is None or source.seq_id == sequence.seq_id:
            return
        llama_cpp.llama_memory_seq_cp(memory, source.seq_id, sequence.seq_id, -1, -1)
        llama_cpp.llama_memory_seq_rm(memory, sequence.seq_id, source.length, -1)
        sequence.cached += source.length - sequence.n_prefilled
        sequence.n_prefilled = source.length
        self._hold(sequence)

    def _drop_finished_callers(self) -> None:
        """Requests cancelled or past their deadline leave the queue, or free their sequence."""
        now = time.monotonic()

        def gone(request: _Request) -> bool:
            return request.cancelled or (request.deadline is not None and now >= request.deadline)

        with self._cv:
            if any(gone(request) for _, _, request in self._waiting):
                keep = []
                for item in self._waiting:
                    request = item[2]
                    if not gone(request):
                        keep.append(item)
                        continue
                    request.sampler.close()
                    if not request.cancelled:
                        request.resolve(error=EngineTimeout(started=False))
                heapq.heapify(keep)
                self._waiting = keep
        for sequence in list(self._running):
            if gone(sequence.request):
                cancelled = sequence.request.cancelled
                self._finish(sequence, error=None if cancelled else EngineTimeout(started=True))

    def _step(self) -> None:
        """One llama_decode over the running sequences (two when a prompt chunk starts past position 0),
        then sampling, stop checks and retirement."""
        batch = self._batch.batch
        n = 0
        for sequence in self._running:  # one token of every generating sequence
            sequence.logits_index = -1
            if sequence.to_prefill == 0:
                self._put(
                    n, sequence.tokens[-1], len(sequence.request.prompt) + len(sequence.tokens) - 1, sequence
                )
                batch.logits[n] = True
                sequence.logits_index = n
                n += 1
        prefilling = [s for s in self._running if s.to_prefill > 0]
        if not prefilling:
            self._decode(n, None)
            return
        sequence = self._next_prompt(prefilling)  # then a chunk of ONE prompt (exactness)
        if self.prefix_reuse:
            self._reuse(sequence)
        if sequence.n_prefilled and n:
            # Past position 0 the chunk is decoded alone: beside sequences with consecutive ids llama.cpp
            # gives its first token a one-row micro-batch, whose attention is not bit-exact.
            if not self._decode(n, None):
                return
            n = 0
        # The last chunk is at least 2 tokens long (a 1-token chunk past position 0: ditto).
        take = min(sequence.to_prefill, N_BATCH - n)
        take -= sequence.to_prefill - take == 1
        prompt, start = sequence.request.prompt, sequence.n_prefilled
        for position in range(start, start + take):
            self._put(n, prompt[position], position, sequence)
            n += 1
        if start + take == len(prompt):  # logits of the prompt's last token: its first new token
            batch.logits[n - 1] = True
            sequence.logits_index = n - 1
        self._decode(n, (sequence, take))

    def _next_prompt(self, prefilling: list[_Sequence]) -> _Sequence:
        """The prompt to prefill next: the lowest `prefill_order`, where a sequence waiting for a sharer
        still prefilling their common prefix ranks just after that sharer."""
        if not self.prefix_reuse:
            return min(prefilling, key=lambda s: s.prefill_order(None))
        by_id = {s.seq_id: s for s in prefilling}

        def key(sequence: _Sequence) -> tuple[tuple[int, int, int], int]:
            source = sequence.source(self._streams)
            blocker = by_id.get(source.blocked_by) if source and source.blocked_by is not None else None
            if blocker is None:
                return (sequence.prefill_order(source), 0)
            return (blocker.prefill_order(blocker.source(self._streams)), 1)

        return min(prefilling, key=key)

    def _put(self, n: int, token: int, position: int, sequence: _Sequence) -> None:
        batch = self._batch.batch
        batch.token[n], batch.pos[n], batch.n_seq_id[n] = token, position, 1
        batch.seq_id[n][0] = sequence.seq_id
        batch.logits[n] = False

    def _decode(self, n: int, chunk: tuple[_Sequence, int] | None) -> bool:
        """Decode the batch's first `n` tokens (`chunk`: the prompt sequence and how many of its tokens),
        then sample and check every sequence with logits; False when llama.cpp failed (all finished)."""
        self._batch.batch.n_tokens = n
        try:
            self._context.decode(self._batch)
        except RuntimeError as error:
            for sequence in list(self._running):
                self._finish(sequence, error=error)
            return False
        finally:
            with self._cv:
                self._steps += 1
        if chunk is not None:
            chunk[0].n_prefilled += chunk[1]
            self._hold(chunk[0])
        for sequence in list(self._running):
            if sequence.logits_index >= 0:
                token = sequence.request.sampler.sample(self._context, sequence.logits_index)
                sequence.logits_index = -1
                self._accept(sequence, token)
        return True

    def _accept(self, sequence: _Sequence, token: int) -> None:
        import llama_cpp

        request = sequence.request
        if llama_cpp.llama_vocab_is_eog(self.model.vocab, token):
            if request.include_eog:
                sequence.tokens.append(token)
            self._finish(sequence, reason="stop")
            return
        sequence.tokens.append(token)
        seen = len(sequence.text)
        sequence.text += self.model.detokenize([token])
        for stop in request.stop:  # in the request's order, as llama-cpp-python's Llama checks them
            at = sequence.text.find(stop, max(0, seen - len(stop) + 1))
            if at >= 0:
                del sequence.text[at:]
                self._finish(sequence, reason="stop")
                return
        if len(sequence.tokens) >= request.max_new_tokens:
            self._finish(sequence, reason="length")

    def _finish(
        self,
        sequence: _Sequence,
        reason: Literal["stop", "length"] = "length",
        error: BaseException | None = None,
    ) -> None:
        """Retire a sequence: free its sampler and its KV stream but the prompt's prefilled tokens (a
        free slot's cached prefix; nothing kept after a llama.cpp failure), then resolve its request
        (error None and the request cancelled: nobody waits)."""
        import llama_cpp

        self._running.remove(sequence)
        kept = sequence.n_prefilled if self.prefix_reuse and not isinstance(error, RuntimeError) else 0
        llama_cpp.llama_memory_seq_rm(self._context.memory, sequence.seq_id, kept, -1)
        self._streams.hold(sequence.seq_id, sequence.request.prompt, kept, growing=False)
        request = sequence.request
        request.sampler.close()
        with self._cv:
            self._free.append(sequence.seq_id)
        if error is not None:
            request.resolve(error=error)
        elif not request.cancelled:
            request.resolve(Generation(sequence.tokens, bytes(sequence.text), reason, sequence.cached))
