"""The embedded embedding backend: a BERT sentence-embedding model run in-process by llama.cpp.

    backend = LlamaEmbedBackend("all-minilm-l6-v2", config)
    body = await backend.embeddings({"model": "all-minilm-l6-v2", "input": ["a", "b"]})

The model ships as safetensors (`batchinfer.backends.bert_gguf` writes its GGUF on first load). One
`EmbedEngine` per process and model: one thread takes the waiting inputs of every request, packs as
many as fit (`n_seq_max` sequences, `n_batch` tokens) into one `llama_decode`, mean-pools each
sequence's token vectors (float64, in numpy: the pooling the model card names) and L2-normalises them
(sentence-transformers' `Normalize` module), so many short inputs of many lines share each call.

Exactness (the same input gives the same vector bit for bit in any mix): llama.cpp's encoder attends
over the whole call at once, masking other sequences out; its softmax and attention-times-V sums run
over the call's rows `ALIGN` (8: AVX2's float32 lanes; NEON's 4 divide it) at a time, so where a
sequence starts changes which lane sums which of its tokens, and so the last bits (up to ~3e-4 a
component, measured). Each sequence therefore starts at a multiple of `ALIGN` and the call's length
is one too, the gaps filled with [PAD] tokens of one padding sequence of their own (masked from every
real one): 0 difference over 40 random mixes of 1 to 60 inputs (measured), for ~30% more tokens on
short inputs. The padding sequence's positions must stay within the trained context: `n_seq_max` is
at most 64. Flash attention is off (its CPU kernel tiles from 64 rows, with other sums: 1e-4
differences again).

Request mapping (OpenAI `/v1/embeddings` -> the model): strings are tokenized with the model's
WordPiece vocabulary, [CLS] and [SEP] added; token-id inputs are the model's own ids, wrapped in
[CLS] ... [SEP] the same way. An input longer than the model's trained context (512 tokens with
them) is a 400 naming the input's index; `dimensions` is a 400 (the model has no Matryoshka training).
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from batchinfer.backends.base import BackendError, require_utf8
from batchinfer.backends.bert_gguf import bert_gguf
from batchinfer.backends.llama_engine import usable_cpus
from batchinfer.wire.embeddings import EmbeddingsBody, EmbeddingsResponse
from batchinfer.wire.openai import EMBEDDINGS_ENDPOINT

if TYPE_CHECKING:
    import numpy as np

    from batchinfer.backends.config import LlamaEmbedConfig

__all__ = ["ALIGN", "EmbedEngine", "LlamaEmbedBackend", "find_package_dir"]

ALIGN = 8


def aligned(n: int) -> int:
    """`n` tokens rounded up to a multiple of `ALIGN`: what a sequence occupies in a call."""
    return n + (-n % ALIGN)


@dataclass(eq=False)
class _Request:
    """The inputs of one request, its vectors as they come, and where to say it is done."""

    tokens: list[list[int]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[list[float]]]
    vectors: dict[int, list[float]] = field(default_factory=dict)


class EmbedEngine:
    """One embedding model loaded by llama.cpp and the thread that embeds the inputs given to `embed`.

    `n_batch` tokens and `n_seq_max` sequences at most per decode call; the model's own limits are
    `n_ctx_train` (tokens an input may have), `n_vocab`, `n_embd`. Loads in the constructor (call it
    off the event loop); raises `ValueError` when llama.cpp cannot load the file.
    """

    def __init__(self, path: Path, *, n_batch: int, n_seq_max: int, n_threads: int) -> None:
        import llama_cpp
        from llama_cpp import _internals as internals
        from llama_cpp._logger import set_verbose

        set_verbose(False)
        llama_cpp.llama_backend_init()
        self.model = internals.LlamaModel(
            path_model=str(path), params=internals.LlamaModel.default_params(), verbose=False
        )
        params = internals.LlamaContext.default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max + 1  # and the padding sequence
        params.n_threads = params.n_threads_batch = n_threads
        params.embeddings = True
        params.kv_unified = True  # an encoder keeps no KV state: one context shared by the inputs
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE  # pooled here, per sequence
        # Flash attention's CPU kernel switches to a tiled one from 64 rows: other sums (exactness).
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.no_perf = True
        self._context = internals.LlamaContext(model=self.model, params=params, verbose=False)
        self._batch = internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        self.n_batch, self.n_seq_max = n_batch, n_seq_max
        self.n_ctx_train = min(self.model.n_ctx_train(), n_batch)
        self.n_vocab, self.n_embd = self.model.n_vocab(), self.model.n_embd()
        self.cls, self.sep = self.model.token_bos(), llama_cpp.llama_vocab_sep(self.model.vocab)
        pad = llama_cpp.llama_vocab_pad(self.model.vocab)
        self._pad = pad if pad >= 0 else self.cls
        self._waiting: collections.deque[tuple[_Request, int]] = collections.deque()
        self._wake = threading.Condition()
        threading.Thread(target=self._run, name="embed-engine", daemon=True).start()

    def tokenize(self, text: str) -> list[int]:
        """`text` as the model's token ids, [CLS] first and [SEP] last."""
        return self.model.tokenize(text.encode("utf-8"), add_bos=True, special=False)

    def wrap(self, ids: list[int]) -> list[int]:
        """Token ids given by a request, with [CLS] and [SEP] added where they are missing."""
        head = [] if ids[:1] == [self.cls] else [self.cls]
        tail = [] if ids[-1:] == [self.sep] else [self.sep]
        return [*head, *ids, *tail]

    async def embed(self, tokens: list[list[int]]) -> list[list[float]]:
        """The normalised vectors of the token lists (each within `n_ctx_train`), in their order.
        Raises `RuntimeError` when llama.cpp fails to decode."""
        loop = asyncio.get_running_loop()
        request = _Request(tokens, loop, loop.create_future())
        with self._wake:
            self._waiting.extend((request, index) for index in range(len(tokens)))
            self._wake.notify()
        return await request.future

    def _take(self) -> list[tuple[_Request, int]]:
        """The next inputs to decode together, oldest first (blocks until there is one)."""
        with self._wake:
            while not self._waiting:
                self._wake.wait()
            taken, size = [], 0
            while self._waiting and len(taken) < self.n_seq_max:
                request, index = self._waiting[0]
                if taken and size + aligned(len(request.tokens[index])) > self.n_batch:
                    break
                size += aligned(len(request.tokens[index]))
                taken.append(self._waiting.popleft())
            return taken

    def _run(self) -> None:
        while True:
            taken = self._take()
            try:
                vectors = self._decode([request.tokens[index] for request, index in taken])
            except Exception as exc:  # a failed call fails its requests, not the thread
                for request in {request for request, _ in taken}:
                    request.loop.call_soon_threadsafe(_fail, request.future, exc)
                continue
            for (request, index), vector in zip(taken, vectors, strict=True):
                request.vectors[index] = vector
                if len(request.vectors) == len(request.tokens):
                    done = [request.vectors[i] for i in range(len(request.tokens))]
                    request.loop.call_soon_threadsafe(_succeed, request.future, done)

    def _add(self, token: int, position: int, seq_id: int) -> None:
        batch = self._batch.batch
        i = batch.n_tokens
        batch.token[i], batch.pos[i] = token, position
        batch.seq_id[i][0], batch.n_seq_id[i] = seq_id, 1
        batch.logits[i] = True  # every token's vector is an output: they are pooled here
        batch.n_tokens += 1

    def _pad_to_alignment(self, padding: int) -> int:
        """Fill the call up to a multiple of `ALIGN` with the padding sequence (id `n_seq_max`), whose
        positions go on from `padding`; returns its next position."""
        while self._batch.batch.n_tokens % ALIGN:
            self._add(self._pad, padding, self.n_seq_max)
            padding += 1
        return padding

    def _decode(self, sequences: list[list[int]]) -> list[list[float]]:
        """One decode call of the sequences (each at an aligned start, see the module docstring); each
        sequence's mean-pooled, normalised vector."""
        import llama_cpp
        import numpy as np

        self._batch.reset()
        starts, padding = [], 0
        for seq_id, tokens in enumerate(sequences):
            starts.append(self._batch.batch.n_tokens)
            for position, token in enumerate(tokens):
                self._add(token, position, seq_id)
            padding = self._pad_to_alignment(padding)
        self._context.decode(self._batch)
        total = self._batch.batch.n_tokens
        pointer = llama_cpp.llama_get_embeddings(self._context.ctx)
        rows = np.ctypeslib.as_array(pointer, shape=(total * self.n_embd,)).reshape(total, self.n_embd)
        return [
            _normalised(rows[start : start + len(tokens)].astype(np.float64).mean(axis=0))
            for start, tokens in zip(starts, sequences, strict=True)
        ]


def _normalised(vector: np.ndarray) -> list[float]:
    import numpy as np

    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm > 0 else vector).astype(np.float32).tolist()


def _succeed(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], exc: Exception) -> None:
    if not future.done():
        future.set_exception(RuntimeError(f"{type(exc).__name__}: {exc}"))


def find_package_dir(package: str) -> Path:
    """The directory of installed Python package `package`, found without importing it. Raises
    `FileNotFoundError` when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"Python package {package!r} (which ships the model) is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


_ENGINES: dict[tuple[Path, int, int, int], EmbedEngine] = {}
_ENGINES_LOCK = threading.Lock()


def _shared_engine(path: Path, n_batch: int, n_seq_max: int, n_threads: int) -> EmbedEngine:
    with _ENGINES_LOCK:
        key = (path, n_batch, n_seq_max, n_threads)
        if key not in _ENGINES:
            _ENGINES[key] = EmbedEngine(path, n_batch=n_batch, n_seq_max=n_seq_max, n_threads=n_threads)
        return _ENGINES[key]


class LlamaEmbedBackend:
    """An embeddings backend answering as registry model `name` (see the module docstring).

    Construction finds the model's files (raising `FileNotFoundError`) but loads nothing; the first
    request writes the GGUF (once) and loads the engine, shared by every backend of the same file
    and settings in the process. `concurrency_hint`: requests worth having in flight, enough to fill
    a decode call with single-input lines.
    """

    serves: ClassVar[frozenset[str]] = frozenset({EMBEDDINGS_ENDPOINT})

    def __init__(self, name: str, config: LlamaEmbedConfig) -> None:
        self.name = name
        self.config = config
        model_dir = config.model_dir or find_package_dir(config.package) / config.package_path
        if not (model_dir / "model.safetensors").is_file():
            raise FileNotFoundError(f"no model.safetensors in the embedding model directory {model_dir}")
        self._model_dir = model_dir.resolve()
        self._cache_dir = config.cache_dir or Path(tempfile.gettempdir()) / "batchinfer-models"
        self.concurrency_hint = config.n_seq_max
        self._engine: EmbedEngine | None = None

    async def engine(self) -> EmbedEngine:
        """The process's engine for this model, loaded on first use. Raises `BackendError(500,
        model_error)` when the GGUF cannot be written or loaded."""
        if self._engine is not None:
            return self._engine
        try:
            self._engine = await asyncio.to_thread(self._load)
            return self._engine
        except Exception as exc:
            raise BackendError(
                500,
                f"The model failed to load: {type(exc).__name__}: {exc}",
                type="server_error",
                code="model_error",
            ) from exc

    def _load(self) -> EmbedEngine:
        path = bert_gguf(self._model_dir, self._cache_dir)
        threads = self.config.n_threads or usable_cpus()
        return _shared_engine(path, self.config.n_batch, self.config.n_seq_max, threads)

    async def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one OpenAI embeddings body with an `EmbeddingsResponse` dict.

        Raises `BackendError`: 400 `invalid_encoding` (a lone surrogate), 400 `invalid_value` with
        param `dimensions` (not supported by this model), 400 `invalid_value` with param `input[i]`
        (a token id outside the vocabulary), 400 `context_length_exceeded` with param `input[i]` (an
        input longer than the model's context), 500 `model_error` (llama.cpp failed).
        """
        require_utf8(body)
        request = EmbeddingsBody.model_validate(body)
        if request.dimensions is not None:
            raise BackendError(
                400,
                f"The model '{self.name}' does not support 'dimensions': its vectors have a fixed size.",
                code="invalid_value",
                param="dimensions",
            )
        engine = await self.engine()
        tokens = [_input_tokens(engine, value, index) for index, value in enumerate(request.inputs())]
        try:
            vectors = await engine.embed(tokens)
        except RuntimeError as exc:
            raise BackendError(
                500, f"The model failed: {exc}", type="server_error", code="model_error"
            ) from exc
        return EmbeddingsResponse.of(
            self.name, vectors, request.encoding_format, prompt_tokens=sum(map(len, tokens))
        ).model_dump()


def _input_tokens(engine: EmbedEngine, value: str | list[int], index: int) -> list[int]:
    """Input `index` as the model's tokens, checked against its vocabulary and context."""
    if isinstance(value, str):
        tokens = engine.tokenize(value)
    else:
        if bad := next((token for token in value if token >= engine.n_vocab), None):
            raise BackendError(
                400,
                f"Invalid token id {bad} in input[{index}]: this model's vocabulary has {engine.n_vocab} "
                "tokens.",
                code="invalid_value",
                param=f"input[{index}]",
            )
        tokens = engine.wrap(value)
    if len(tokens) > engine.n_ctx_train:
        raise BackendError(
            400,
            f"input[{index}] is {len(tokens)} tokens long; this model's maximum context length is "
            f"{engine.n_ctx_train} tokens. Please shorten or split the input.",
            code="context_length_exceeded",
            param=f"input[{index}]",
        )
    return tokens
