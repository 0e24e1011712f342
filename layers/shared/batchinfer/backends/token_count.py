"""Counting a request's input tokens before it runs (a batch's dry run), per model.

- An embedded `llama_cpp` model, where llama-cpp-python is installed (the local stack, the image
  functions): its GGUF's own tokenizer and chat template, loaded vocabulary-only (no weights, no
  context: milliseconds), the prompt rendered and tokenized exactly as `LlamaCppBackend` does, so the
  count equals the `prompt_tokens` the run reports (`method` `tokenizer`).
- Every other model, and the embedded one where llama-cpp-python is absent (the API function on AWS
  Lambda ships without it): an estimate of one token per `BYTES_PER_TOKEN` UTF-8 bytes of the
  request's text, the rule of thumb for English text with byte-pair tokenizers (`method` `estimate`).
  Remote servers are never called: a dry run must cost nothing.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

from batchinfer.backends.base import chat_request, completion_request
from batchinfer.backends.config import LlamaCppConfig, ModelConfig
from batchinfer.wire.openai import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, RESPONSES_ENDPOINT
from batchinfer.wire.responses import ResponseBody, chat_body

Method = Literal["tokenizer", "estimate"]
BYTES_PER_TOKEN = 4
# The parts of a body that are its input, per endpoint kind, for the estimate.
_INPUT_FIELDS = ("messages", "prompt", "input", "instructions", "system")


class TokenCounter(Protocol):
    """Counts the input tokens of one request body of an endpoint (`method`: how)."""

    method: Method

    def count(self, endpoint: str, body: dict[str, Any]) -> int:
        """Input tokens of `body` sent to `endpoint` (a url such as /v1/chat/completions)."""
        ...


class Estimate:
    """One token per `BYTES_PER_TOKEN` bytes of the body's input fields (their JSON), rounded up."""

    method: Method = "estimate"

    def count(self, endpoint: str, body: dict[str, Any]) -> int:
        """The estimated input tokens of `body` (any endpoint)."""
        given = {name: body[name] for name in _INPUT_FIELDS if name in body}
        text = json.dumps(given, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
        return math.ceil(len(text) / BYTES_PER_TOKEN)


class LlamaVocab:
    """The exact prompt tokens of an embedded GGUF model: its tokenizer and chat template, as
    `LlamaCppBackend` renders chat (and Responses, translated to chat) and completions prompts.
    Other endpoints are estimated (`Estimate`)."""

    method: Method = "tokenizer"

    def __init__(self, path: Path) -> None:
        from llama_cpp import _internals as internals
        from llama_cpp._logger import set_verbose

        from batchinfer.backends.llama_cpp import chat_formatter

        set_verbose(False)
        params = internals.LlamaModel.default_params()
        params.vocab_only = True
        self.model = internals.LlamaModel(path_model=str(path), params=params, verbose=False)
        self.formatter = chat_formatter(self.model)

    def _tokens(self, text: str, *, add_bos: bool) -> int:
        return len(self.model.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True))

    def count(self, endpoint: str, body: dict[str, Any]) -> int:
        """The prompt tokens of `body` as the run counts them (`prompt_tokens`)."""
        if endpoint == COMPLETIONS_ENDPOINT:
            return sum(self._tokens(text, add_bos=True) for text in completion_request(body).prompts())
        if endpoint == RESPONSES_ENDPOINT:
            body = chat_body(ResponseBody.model_validate(body))
        elif endpoint != CHAT_ENDPOINT:
            return Estimate().count(endpoint, body)
        # As `LlamaCppBackend._chat_prompt`: the template knows "system", not "developer".
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            for m in chat_request(body).messages
        ]
        rendered = self.formatter(messages=messages)
        return self._tokens(rendered.prompt, add_bos=not rendered.added_special)


@lru_cache(maxsize=4)
def _llama_vocab(path: Path) -> LlamaVocab:
    return LlamaVocab(path)


def counter_for(config: ModelConfig) -> TokenCounter:
    """The most exact counter this process has for a model of `config` (see the module docstring)."""
    if not isinstance(config, LlamaCppConfig):
        return Estimate()
    try:
        from batchinfer.backends.llama_cpp import find_gguf

        return _llama_vocab(config.model_path or find_gguf(config.package))
    except ImportError:  # llama-cpp-python is not installed here (the API function on Lambda)
        return Estimate()
