"""Support for the HTTP API tests on the local stack: keys, batch files, polling, a holdable upstream.

`HoldableUpstream` is a real OpenAI-compatible HTTP server on loopback (served to the pipeline through
the registry's `openai` backend) whose requests can be held on demand: the one thing a real model
server can't do, and what a test of cancel or expiry *while requests run* needs to be exact.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchinfer.data import accounts
from batchinfer_local import LocalStack

MODEL = "smollm2-135m-instruct"
SCRIPTED = "scripted-model"
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def chat_line(custom_id: str, content: str, *, model: str = MODEL, max_tokens: int = 2, **extra: Any) -> str:
    """One batch input line for /v1/chat/completions (greedy, tiny answers: quick on the real model)."""
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body},
        ensure_ascii=False,
    )


def jsonl(*lines: str) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def _prompt_of(path: str, body: dict[str, Any]) -> str:
    """The prompt of a request to `path`: the last message (chat), the prompts joined by a space
    (`/completions`), the input or its last item's text (`/responses`)."""
    if path.endswith("/chat/completions"):
        return body["messages"][-1]["content"]
    if path.endswith("/completions"):
        prompt = body["prompt"]
        return prompt if isinstance(prompt, str) else " ".join(prompt)
    given = body["input"]
    return given if isinstance(given, str) else given[-1]["content"]


def _text_answer(path: str, body: dict[str, Any], n: int) -> dict[str, Any]:
    """The `text_completion` (one `echo: <prompt>` choice per prompt) or Response (`echo: <input>`)
    answer of request `n`, with usage of 3 tokens in and 2 out (per request)."""
    if path.endswith("/completions"):
        prompts = [body["prompt"]] if isinstance(body["prompt"], str) else body["prompt"]
        return {
            "id": f"cmpl-{n}",
            "object": "text_completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [
                {"text": f"echo: {p}", "index": i, "logprobs": None, "finish_reason": "stop"}
                for i, p in enumerate(prompts)
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
    text = f"echo: {_prompt_of(path, body)}"
    return {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": body.get("model"),
        "output": [
            {
                "type": "message",
                "id": f"msg_{n}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": 3,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 5,
        },
    }


class HoldableUpstream:
    """An OpenAI-compatible `/v1/chat/completions` server (and `/v1/completions`, `/v1/responses`,
    answered by `_text_answer`, and `/v1/embeddings`, see `embeddings`): prompts containing `HOLD` wait
    for `release()`,
    prompts containing `GATE` each wait for one of the passes `admit(n)` hands out (or `release()`),
    prompts containing `FAIL` get a 400 error while `failing` is set (a model server that refuses them for
    a while: clear it and they are answered).

    `arrivals` lists the prompts in the order they arrived; `held` is set once a HOLD prompt arrived.
    Every answer is a chat completion with usage (3 prompt + 2 completion tokens).
    """

    def __init__(self) -> None:
        self.arrivals: list[str] = []
        self.failing = True
        self.held = threading.Event()
        self._release = threading.Event()
        self._passes = threading.Semaphore(0)
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if self.path.endswith("/embeddings"):
                    self._send(*upstream.embeddings(body))
                    return
                prompt = _prompt_of(self.path, body)
                upstream.arrivals.append(prompt)
                if "HOLD" in prompt:
                    upstream.held.set()
                    upstream._release.wait(timeout=60)
                if "GATE" in prompt:
                    deadline = time.monotonic() + 60
                    while not upstream._release.is_set() and time.monotonic() < deadline:
                        if upstream._passes.acquire(timeout=0.05):
                            break
                if "FAIL" in prompt and upstream.failing:
                    self._send(
                        400,
                        {
                            "error": {
                                "message": "scripted failure",
                                "type": "invalid_request_error",
                                "param": None,
                                "code": "scripted",
                            }
                        },
                    )
                    return
                if not self.path.endswith("/chat/completions"):
                    self._send(200, _text_answer(self.path, body, len(upstream.arrivals)))
                    return
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(upstream.arrivals)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model"),
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": f"echo: {prompt}"},
                            }
                        ],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                    },
                )

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def embeddings(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The status and body answering an embeddings request: each input's vector is
        `[characters, 0.5]`, usage 2 tokens an input; an input containing `FAIL` gets a 400."""
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        self.arrivals.extend(map(str, inputs))
        if any("FAIL" in str(text) for text in inputs):
            return 400, {
                "error": {
                    "message": "scripted failure",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "scripted",
                }
            }
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(str(text))), 0.5]}
            for i, text in enumerate(inputs)
        ]
        usage = {"prompt_tokens": 2 * len(inputs), "total_tokens": 2 * len(inputs)}
        return 200, {"object": "list", "data": data, "model": body.get("model"), "usage": usage}

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def release(self) -> None:
        """Let held requests (and later HOLD and GATE prompts) answer."""
        self._release.set()

    def admit(self, n: int) -> None:
        """Let `n` GATE prompts answer (waiting ones first, then the next to arrive)."""
        self._passes.release(n)

    def rearm(self) -> None:
        """Hold HOLD prompts again (after a `release`) and fail FAIL prompts, with a fresh `arrivals` log."""
        self.failing = True
        self.arrivals.clear()
        self.held.clear()
        self._release.clear()
        self._passes = threading.Semaphore(0)

    def __enter__(self) -> HoldableUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()


def write_registry(path: Path, upstream: HoldableUpstream) -> Path:
    """A model registry serving the embedded SmolLM2 and `scripted-model` on the holdable upstream."""
    path.write_text(f"""models:
  {MODEL}:
    backend: llama_cpp
    n_ctx: 2048
  {SCRIPTED}:
    backend: openai
    base_url: {upstream.base_url}
    model: scripted
    timeout: 90
""")
    return path


@contextmanager
def stack_with_upstream(tmp_path: Path, **stack_args: Any) -> Iterator[tuple[LocalStack, HoldableUpstream]]:
    """A local stack whose registry also serves `scripted-model` from a `HoldableUpstream`."""
    with HoldableUpstream() as upstream, pytest.MonkeyPatch.context() as patch:
        patch.setenv("MODEL_REGISTRY", str(write_registry(tmp_path / "models.yaml", upstream)))
        with LocalStack(port=0, **stack_args) as stack:
            try:
                yield stack, upstream
            finally:
                upstream.release()  # held requests answer now, so no worker outlives its stack
                with contextlib.suppress(TimeoutError):
                    stack.wait_idle(timeout=60)


def api_client(stack: LocalStack, key: str | None) -> httpx.Client:
    """An httpx client of `<stack>/v1` sending `key` as the bearer token (None: no Authorization)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=f"{stack.base_url}/v1", headers=headers, timeout=30)


def new_account(account_id: str, **settings: Any) -> str:
    """A key for a new account (with `accounts.configure_account` settings); the stack must be running."""
    secret, _ = accounts.create_key(account_id, name="test")
    if settings:
        accounts.configure_account(account_id, **settings)
    return secret


def upload(http: httpx.Client, data: bytes, name: str = "input.jsonl") -> str:
    """POST /v1/files (purpose batch); the new file id."""
    response = http.post(
        "/files", data={"purpose": "batch"}, files={"file": (name, data, "application/jsonl")}
    )
    assert response.status_code == 200, response.text
    return response.json()["id"]


def create(http: httpx.Client, file_id: str, **fields: Any) -> httpx.Response:
    """POST /v1/batches for an uploaded file (OpenAI dialect)."""
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        **fields,
    }
    return http.post("/batches", json=body)


def wait_for(
    http: httpx.Client,
    batch_id: str,
    statuses: set[str] = TERMINAL,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Poll GET /v1/batches/{id} until its status is one of `statuses`; the Batch object."""
    deadline = time.monotonic() + timeout
    while True:
        batch = http.get(f"/batches/{batch_id}").raise_for_status().json()
        if batch["status"] in statuses:
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch['status']} after {timeout} s")
        time.sleep(0.2)


def wait_until(predicate: Any, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached after {timeout} s")
        time.sleep(0.1)


def result_lines(http: httpx.Client, file_id: str | None) -> list[dict[str, Any]]:
    """The parsed lines of a result file (none for a missing file)."""
    if file_id is None:
        return []
    response = http.get(f"/files/{file_id}/content")
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.content.splitlines()]
