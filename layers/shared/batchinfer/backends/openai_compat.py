"""The HTTP backend: any server speaking OpenAI's `POST /chat/completions` (vLLM, TGI, Ollama, ...), and
its `/completions` and `/responses` where it has them.

It sends one request and maps the outcome to the answer's dict or a `BackendError`; it never retries
(the shard worker owns retries and their budget), it only says whether a retry may succeed. A server
without `/responses` answers those lines with its 404 (no fallback to chat: its answer would not be
the Responses API the batch asked for, and a 404 may also mean an unknown model).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, ClassVar

from batchinfer.backends.base import BackendError, RegistryError, require_utf8
from batchinfer.backends.http import Answer, post_json, upstream_error
from batchinfer.wire.openai import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    EMBEDDINGS_ENDPOINT,
    RESPONSES_ENDPOINT,
)

if TYPE_CHECKING:
    from batchinfer.backends.config import OpenAICompatConfig

__all__ = ["OpenAICompatBackend"]

_MAX_ERROR_TEXT = 500


def _error_fields(response: Answer) -> tuple[str, str | None, str | None, str | None]:
    """(message, type, code, param) from an error response of any common server flavour."""
    try:
        data = response.json()
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):  # OpenAI, vLLM
            code = error.get("code")
            return (
                error["message"],
                error.get("type") if isinstance(error.get("type"), str) else None,
                str(code) if code is not None else None,
                error.get("param") if isinstance(error.get("param"), str) else None,
            )
        if isinstance(error, str):  # TGI ({"error", "error_type"}), Ollama
            return (
                error,
                None,
                data.get("error_type") if isinstance(data.get("error_type"), str) else None,
                None,
            )
        for key in ("message", "detail"):  # FastAPI, generic
            if key in data:
                detail = data[key]
                return (
                    (detail if isinstance(detail, str) else json.dumps(detail))[:_MAX_ERROR_TEXT],
                    None,
                    None,
                    None,
                )
    return response.summary(), None, None, None


class OpenAICompatBackend:
    """A `ChatBackend` answering as registry model `name` by forwarding to an OpenAI-compatible server.

    It passes through chat completions and embeddings (vLLM and TGI serve the latter from an
    embedding model); whether the upstream model answers an endpoint is the upstream's to say.
    The body goes to `{base_url}/chat/completions` (`/embeddings`) with `model` replaced by the
    upstream name and any `stream` flag removed (a batch never streams); the answer comes back with
    `model` set to `name`.
    Construction raises `RegistryError` when `api_key_env` names an unset environment variable.
    `serves`: the batch endpoints it passes through, each to the server's own url.
    """

    serves: ClassVar[frozenset[str]] = frozenset(
        {CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, RESPONSES_ENDPOINT, EMBEDDINGS_ENDPOINT}
    )

    def __init__(self, name: str, config: OpenAICompatConfig) -> None:
        self.name = name
        self.config = config
        self.base_url = str(config.base_url).rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.timeout = config.timeout
        api_key: str | None = None
        if config.api_key is not None:
            api_key = config.api_key.get_secret_value()
        elif config.api_key_env is not None:
            api_key = os.environ.get(config.api_key_env)
            if not api_key:
                raise RegistryError(
                    f"model '{name}': environment variable {config.api_key_env} (api_key_env) is not set"
                )
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send one chat completions body upstream; return its `chat.completion` with our model name.

        Raises `BackendError`:
        - 400 `invalid_encoding`: a string of `body` is not valid Unicode (never sent);
        - the upstream 4xx with its message/type/code/param (408 and 429 retryable, with
          `retry_after` from Retry-After);
        - the upstream 5xx, retryable, with `retry_after`;
        - 502 `bad_response`, retryable: a 2xx whose body is not a JSON chat completion;
        - 502 `upstream_unavailable`, retryable: connection refused/reset, protocol errors;
        - 504 `timeout`, retryable: no full answer within `timeout` seconds.
        """
        return await self._forward(self.url, body, "choices", "a chat completion")

    async def text_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send one completions body to `{base_url}/completions`; its `text_completion` with our model
        name. Raises `BackendError` as `chat_completion` does."""
        return await self._forward(self.base_url + "/completions", body, "choices", "a text completion")

    async def create_response(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send one Responses body to `{base_url}/responses`; its Response object with our model name.
        Raises `BackendError` as `chat_completion` does (the server's 404 when it has no `/responses`)."""
        return await self._forward(self.base_url + "/responses", body, "output", "a Response")

    async def _forward(self, url: str, body: dict[str, Any], key: str, what: str) -> dict[str, Any]:
        """POST `body` (upstream model name, no streaming) to `url`; the answer, which must be an object
        with a list at `key` (`what` names it in the error)."""
        payload = {name: value for name, value in body.items() if name not in ("stream", "stream_options")}
        return self._answer(await self._post(url, payload), key, what)

    async def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send one embeddings body to `{base_url}/embeddings`; return its answer with our model name.

        Raises `BackendError` as `chat_completion` does; 502 `bad_response` when a 2xx body has no
        `data` list.
        """
        return await self._forward(self.base_url + "/embeddings", body, "data", "an embeddings list")

    async def _post(self, url: str, payload: dict[str, Any]) -> Answer:
        """POST `payload` with the upstream model name; the 2xx answer, else raise its `BackendError`."""
        payload["model"] = self.config.model
        try:
            response = await post_json(url, payload, timeout=self.timeout, headers=self._headers)
        except UnicodeEncodeError:  # found while encoding the body (not by a walk of every request)
            require_utf8(payload)  # raises, naming the string
            raise
        if 200 <= response.status < 300:
            return response
        message, err_type, code, param = _error_fields(response)
        raise upstream_error(response, message, type=err_type, code=code, param=param)

    def _answer(self, response: Answer, key: str, what: str) -> dict[str, Any]:
        """The JSON body of a 2xx answer, which must have a `key` list (`what` it is, for the message)."""
        try:
            data = response.json()
        except (ValueError, UnicodeDecodeError) as exc:
            raise BackendError(
                502,
                f"The model server sent malformed JSON: {exc}",
                type="server_error",
                code="bad_response",
                retryable=True,
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get(key), list):
            raise BackendError(
                502,
                f"The model server's answer is not {what} (no '{key}' list).",
                type="server_error",
                code="bad_response",
                retryable=True,
            )
        data["model"] = self.name
        return data
