"""The contract of a batch endpoint: what a request line of it is, and how its result is served and counted.

An endpoint is one module holding one `Endpoint` subclass; `batchinfer.endpoints.registry` lists them.
Validation, the shard worker and the aggregator ask the endpoint of a batch, never its url.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from batchinfer.wire.line_errors import LineError

__all__ = ["BackendServer", "Endpoint", "Server", "Usage"]


class Server(Protocol):
    """What answers the request bodies of one endpoint for the shard worker.

    The worker makes one call per request line, `chat_completion(body)`, whatever the endpoint (a
    chat backend is its own server), and reads `concurrency_hint: int | None` where there is one
    (see `batchinfer.backends.base.ChatBackend`). Returns the result body; raises `BackendError`.
    """

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The result body of one request body (a dict as served in output.jsonl)."""
        ...


class BackendServer:
    """A `Server` that answers an endpoint's bodies through a backend's own methods (a subclass says
    which in `chat_completion`). It has the backend's `concurrency_hint`, and `withdraw_waiting`
    gives back what the backend holds waiting (0 when it holds nothing: see `backends.base.Withdrawable`).
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.concurrency_hint: int | None = getattr(backend, "concurrency_hint", None)

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The result body of one request body; raises `BackendError`."""
        raise NotImplementedError

    def withdraw_waiting(self) -> int:
        """The backend's `withdraw_waiting()`, or 0 when it has none."""
        withdraw = getattr(self.backend, "withdraw_waiting", None)
        return withdraw() if withdraw is not None else 0


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one result counts toward its batch's `usage`: `input_tokens` (the prompt),
    `output_tokens` (generated) and `cached_tokens` (of the prompt, taken from a prompt cache)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0


class Endpoint(ABC):
    """One url this service serves in batches.

    - `template`: the batch's `endpoint` value (`/v1/chat/completions`, `/v2/models/{model}/infer`);
      `pattern` matches the whole url of each request line (a `model` group when the url names it).
    - `body_model`: the request body (pydantic, its rules on the fields); `check_body` words its errors.
    - `model_of`: the model a line names (from the body or the url); `model_param` says where, for
      error messages (`body.model`, `url`).
    - `server(backend)`: how a registry model's backend answers the bodies (see `Server`).
    - `result_model`: the result body a success line carries; `usage(result)` its token counts.
    - `served_by(serves)`: whether a backend serving the templates `serves` (its `serves` attribute)
      can answer this endpoint.
    - `max_batch_inputs` and `inputs(body)`: a batch-wide cap on inputs (embeddings: 50,000).
    - `listed`: False for an endpoint no user writes lines of (the Message Batches routes write
      them): error messages do not suggest it.
    - `plain_body`: an optional fast check (None: none), True only for bodies `check_body` accepts
      (False says nothing), for the common line of a large file.
    """

    template: ClassVar[str]
    pattern: ClassVar[re.Pattern[str]]
    model_param: ClassVar[str]
    body_model: ClassVar[type[BaseModel]]
    result_model: ClassVar[type[BaseModel]]
    plain_body: ClassVar[Callable[[dict[str, Any]], bool] | None] = None
    # The most inputs (see `inputs`) a whole batch may hold; None: no limit beyond its line count.
    max_batch_inputs: ClassVar[int | None] = None
    listed: ClassVar[bool] = True

    @abstractmethod
    def check_body(self, body: dict[str, Any], line: int) -> list[LineError]:
        """The errors of request body `body` on input line `line` (1-based); empty when it is valid."""

    @abstractmethod
    def model_of(self, match: re.Match[str], body: dict[str, Any]) -> str | None:
        """The model a line names (`match`: its url against `pattern`), or None when absent."""

    @abstractmethod
    def usage(self, result: dict[str, Any]) -> Usage:
        """The tokens a success line's result body counts (zero where it says nothing)."""

    def served_by(self, serves: frozenset[str]) -> bool:
        """Whether a backend that declares `serves` (endpoint templates) answers this endpoint: by default
        when it lists this template. An endpoint that `server` translates onto another one (a plug-in
        answered through chat) says so here."""
        return self.template in serves

    def inputs(self, body: dict[str, Any]) -> int:
        """How many inputs a valid body counts toward `max_batch_inputs` (one unless the endpoint says)."""
        return 1

    def server(self, backend: Any) -> Server:
        """What answers this endpoint's bodies on `backend` (a registry model's backend): the backend
        itself unless the endpoint says otherwise."""
        return backend
