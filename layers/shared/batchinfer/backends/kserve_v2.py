"""The KServe v2 token backend: a remote server taking `POST /v2/models/{model}/infer` with UINT32 token
ids, as MindIE's token inference interface, Triton-style servers and this project's own `/v2` do.

Request and response shapes: `batchinfer.wire.kserve` (KServe v2 / Open Inference Protocol,
https://kserve.github.io/website/docs/concepts/architecture/data-plane/v2-protocol).

Token requests (`generate_tokens`) are sent with every parameter explicit. Chat requests
(`chat_completion`) are turned into token requests: the messages are rendered with the model's chat
template (Jinja, sandboxed, as Hugging Face `apply_chat_template` does), tokenized with the model's
`tokenizer.json` (the `tokenizers` library, no special tokens added: the template writes them), and
the generated ids are decoded (special tokens skipped) into a `chat.completion`. Completions
(`text_completion`) tokenize each raw prompt (the tokenizer's special tokens added, no template) and
answer a `text_completion`, one choice per prompt.

OpenAI -> token parameters: `max_completion_tokens`/`max_tokens` (else `default_max_tokens`) ->
`max_new_tokens`; `temperature` 0 -> greedy (`do_sample` false), absent -> 1.0; `top_p` -> `top_p`
(0 -> greedy); `seed` s -> `s mod (2^64-1) + 1` (the token API wants (0, 2^64-1]); `stop` strings cut the
decoded text; vLLM's `top_k` extension k > 0 -> `top_k` (at most the vocabulary), else (absent, -1 or 0)
the whole vocabulary. `presence_penalty`, `frequency_penalty`
and `response_format` `json_object` cannot be expressed as token parameters and are rejected (400).

Each request is sent once: a 429 or 503 answer is a retryable `BackendError` (with Retry-After), and
the shard worker, the one place that retries, tries again.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from batchinfer.backends.base import BackendError, RegistryError, chat_request, completion_request
from batchinfer.backends.http import Answer, post_json, retryable_status, upstream_error
from batchinfer.wire.chat import ChatCompletionResponse, ChatRequest, CompletionUsage
from batchinfer.wire.completions import (
    DEFAULT_COMPLETION_TOKENS,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from batchinfer.wire.kserve import INT32_MAX, UINT64_MAX, token_request_body
from batchinfer.wire.openai import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, RESPONSES_ENDPOINT, TOKEN_ENDPOINT
from batchinfer.wire.tokens import ModelLimits, SamplingParams, TokenResult

if TYPE_CHECKING:
    from jinja2 import Template
    from tokenizers import Tokenizer

    from batchinfer.backends.config import KServeV2Config

__all__ = ["KServeV2Backend"]


class _Output(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str | None = None
    datatype: str | None = None
    data: list[int]


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    outputs: list[_Output]


def _error_text(response: Answer) -> str:
    """The message of a KServe error body `{"error": "..."}`, else the body's text."""
    try:
        data = response.json()
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return data["error"]
    return response.summary()


class KServeV2Backend:
    """A `ChatBackend` and `TokenBackend` answering as registry model `name` through a KServe v2 server.

    Construction raises `RegistryError` when a configured tokenizer file does not exist; the files are
    read on the first chat request. `serves`: token requests, and with the model's tokenizer files
    chat (Responses through chat) and completions.
    """

    serves: ClassVar[frozenset[str]] = frozenset(
        {CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, RESPONSES_ENDPOINT, TOKEN_ENDPOINT}
    )

    def __init__(self, name: str, config: KServeV2Config) -> None:
        for option in ("tokenizer", "tokenizer_config"):
            path = getattr(config, option)
            if path is not None and not Path(path).is_file():
                raise RegistryError(f"model '{name}': {option} file {path} does not exist")
        self.name = name
        self.config = config
        self.url = f"{str(config.base_url).rstrip('/')}/v2/models/{config.model}/infer"

    # ------------------------------------------------------------------ token requests

    async def token_limits(self) -> ModelLimits:
        """The configured limits (`vocab_size`, `max_seq_len`, `max_input_tokens`); unset ones are left
        to the remote server to check."""
        return ModelLimits(
            vocab_size=self.config.vocab_size,
            max_seq_len=self.config.max_seq_len,
            max_input_tokens=self.config.max_input_tokens,
        )

    async def generate_tokens(self, input_ids: list[int], params: SamplingParams) -> TokenResult:
        """Send one token request and return the generated ids.

        `finish_reason` is `stop` when the last id is the end-of-sequence token (known from
        `tokenizer_config`) or fewer than `max_new_tokens` ids came back, else `length`.
        Raises `BackendError` (see `http.upstream_error`): the server's 4xx with its `{"error"}`
        message, code `invalid_value` (408/429 retryable), its 5xx (retryable), 502 `bad_response`
        for a malformed answer, 502 `upstream_unavailable` when it cannot be reached, 504 `timeout`
        after `timeout` seconds. Sent once: the caller retries what is retryable.
        """
        ids = await self._post(token_request_body(uuid.uuid4().hex, input_ids, params))
        eos = self._eos_id
        stopped = (bool(ids) and ids[-1] == eos) or len(ids) < params.max_new_tokens
        return TokenResult(ids, "stop" if stopped else "length")

    async def _post(self, body: dict[str, Any]) -> list[int]:
        key = self.config.api_key
        headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else None
        response = await post_json(self.url, body, timeout=self.config.timeout, headers=headers)
        status = response.status
        if 200 <= status < 300:
            try:
                return _Response.model_validate_json(response.body).outputs[0].data
            except (ValidationError, IndexError) as exc:
                raise BackendError(
                    502,
                    f"The model server's answer is not a KServe v2 token response: {exc}",
                    type="server_error",
                    code="bad_response",
                    retryable=True,
                ) from None
        # A KServe error is `{"error": message}` alone: a 4xx the server decided on is the request's values.
        client_error = 400 <= status < 500 and not retryable_status(status)
        raise upstream_error(response, _error_text(response), code="invalid_value" if client_error else None)

    # ------------------------------------------------------------------ chat requests

    @cached_property
    def _tokenizer(self) -> Tokenizer:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.config.tokenizer))

    @cached_property
    def _eos_id(self) -> int | None:
        """The id of the configured `eos_token`, or None without tokenizer files."""
        if self.config.tokenizer is None or self.config.tokenizer_config is None:
            return None
        return self._tokenizer.token_to_id(self._template[2])

    @cached_property
    def _template(self) -> tuple[Template, str, str]:
        """The compiled chat template with its bos and eos token strings."""
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        config = json.loads(Path(str(self.config.tokenizer_config)).read_text(encoding="utf-8"))

        def token_text(value: Any) -> str:  # HF writes special tokens as strings or {"content": ...}
            return value.get("content", "") if isinstance(value, dict) else (value or "")

        def raise_exception(message: str) -> None:
            from jinja2 import TemplateError

            raise TemplateError(message)

        # Hugging Face's own settings for chat templates (trim_blocks, lstrip_blocks, sandboxed).
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
        template = config.get("chat_template")
        if not isinstance(template, str) or not template:
            raise BackendError(
                500,
                f"model '{self.name}': {self.config.tokenizer_config} has no chat_template",
                type="server_error",
                code="model_error",
            )
        return (
            env.from_string(template),
            token_text(config.get("bos_token")),
            token_text(config.get("eos_token")),
        )

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer an OpenAI chat completions body through the token server.

        Raises `BackendError`: 400 for the body (as the embedded model: `invalid_value`,
        `unsupported_parameter`, `invalid_encoding`, ...), 500 `model_error` when no tokenizer files are
        configured, and the errors of `generate_tokens`.
        """
        request = chat_request(body, unsupported_by="this model (a token server)")
        self._need_tokenizer("chat")
        input_ids = self._chat_input_ids(request)
        max_new = request.max_completion_tokens or request.max_tokens or self.config.default_max_tokens
        text, finish, completion_tokens = await self._generate_text(
            input_ids, self._params(request, max_new), request.stop
        )
        return ChatCompletionResponse.answer(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            model=self.name,
            content=text,
            finish_reason=finish,
            prompt_tokens=len(input_ids),
            completion_tokens=completion_tokens,
        ).model_dump()

    async def text_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer an OpenAI completions body through the token server: each prompt tokenized as it is
        (the tokenizer's own special tokens added, no chat template), all sent at once, choice `i` for
        `prompt[i]`; `max_tokens` defaults to OpenAI's 16.

        Raises `BackendError`: 400 for the body, 400 `context_length_exceeded` (param `prompt`), 500
        `model_error` without tokenizer files, and the errors of `generate_tokens`.
        """
        request = completion_request(body)
        self._need_tokenizer("completions")
        prompts = [self._tokenizer.encode(text, add_special_tokens=True).ids for text in request.prompts()]
        for input_ids in prompts:
            self._check_fits(input_ids, "prompt")
        params = self._params(request, request.max_tokens or DEFAULT_COMPLETION_TOKENS)
        outs = await asyncio.gather(*(self._generate_text(ids, params, request.stop) for ids in prompts))
        choices = [
            CompletionChoice(text=text, index=i, finish_reason=finish)
            for i, (text, finish, _) in enumerate(outs)
        ]
        usage = CompletionUsage.of(sum(map(len, prompts)), sum(n for _, _, n in outs))
        return CompletionResponse(
            id=f"cmpl-{uuid.uuid4().hex}", model=self.name, choices=choices, usage=usage
        ).model_dump()

    def _need_tokenizer(self, what: str) -> None:
        """Raise `BackendError(500, model_error)` unless the tokenizer files are configured (`what`:
        the kind of request, for the message)."""
        if self.config.tokenizer is None or self.config.tokenizer_config is None:
            raise BackendError(
                500,
                f"model '{self.name}' takes token ids only: set tokenizer and "
                f"tokenizer_config in the registry to serve {what} requests",
                type="server_error",
                code="model_error",
            )

    async def _generate_text(
        self, input_ids: list[int], params: SamplingParams, stop: str | list[str] | None
    ) -> tuple[str, str, int]:
        """Generate after `input_ids`: (the decoded text cut at the first `stop` string, the finish
        reason, the completion's tokens without the end-of-sequence one)."""
        result = await self.generate_tokens(input_ids, params)
        text = self._tokenizer.decode(result.ids, skip_special_tokens=True)
        # The end-of-sequence token is not part of the completion (as llama.cpp and OpenAI count).
        completion_tokens = len(result.ids) - (1 if result.ids and result.ids[-1] == self._eos_id else 0)
        finish = result.finish_reason
        stops = [stop] if isinstance(stop, str) else (stop or [])
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        if cut >= 0:
            text, finish = text[:cut], "stop"
        return text, finish, completion_tokens

    def _check_fits(self, input_ids: list[int], what: str) -> None:
        """Raise `BackendError(400, context_length_exceeded, param=what)` when `input_ids` leave no room
        in `max_seq_len` (`what`: "messages" or "prompt")."""
        if self.config.max_seq_len is not None and len(input_ids) >= self.config.max_seq_len:
            raise BackendError(
                400,
                f"This model's maximum context length is {self.config.max_seq_len} tokens. However, your "
                f"{what} resulted in {len(input_ids)} tokens. Please reduce the length of the {what}.",
                code="context_length_exceeded",
                param=what,
            )

    def _chat_input_ids(self, request: ChatRequest) -> list[int]:
        """The prompt's token ids: the messages through the model's chat template and tokenizer.
        Raises `BackendError(400)`: `invalid_value` when the template rejects the messages,
        `context_length_exceeded` when they leave no room in `max_seq_len`."""
        from jinja2 import TemplateError

        template, bos, eos = self._template
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            for m in request.messages
        ]
        try:
            prompt = template.render(
                messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos
            )
        except TemplateError as exc:
            raise BackendError(
                400,
                f"The model's chat template rejected the messages: {exc}",
                code="invalid_value",
                param="messages",
            ) from None
        input_ids = self._tokenizer.encode(prompt, add_special_tokens=False).ids
        self._check_fits(input_ids, "messages")
        return input_ids

    def _params(self, request: ChatRequest | CompletionRequest, max_new: int) -> SamplingParams:
        """The token server's sampling parameters for a chat or completions request, up to `max_new`
        tokens (temperature or top_p 0: greedy)."""
        greedy = request.temperature == 0 or request.top_p == 0
        vocabulary = self.config.vocab_size or INT32_MAX
        return SamplingParams(
            do_sample=not greedy,
            temperature=request.temperature if request.temperature else 1.0,
            top_k=min(request.top_k, vocabulary) if request.top_k and request.top_k > 0 else vocabulary,
            top_p=request.top_p if request.top_p else 1.0,
            seed=None if request.seed is None else request.seed % UINT64_MAX + 1,
            max_new_tokens=max_new,
        )
