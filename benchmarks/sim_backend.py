"""A simulated OpenAI-compatible model server: fixed latency, fixed capacity, 429 beyond it.

It behaves like Hugging Face TGI with `max_concurrent_requests` (429 "Model is overloaded", no
Retry-After) in front of a model that takes exactly `latency` seconds per request, so the best any
client can do is `capacity / latency` requests per second. Run it in its own process:

    python -m benchmarks.sim_backend --port 8123 --latency 0.2 --capacity 32

`GET /stats` returns the counters, `POST /reset` zeroes them (between runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import uvicorn

_COMPLETION = {
    "object": "chat.completion",
    "model": "sim",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Paris is the capital of France."},
        }
    ],
    "usage": {"prompt_tokens": 24, "completion_tokens": 8, "total_tokens": 32},
}
_OVERLOADED = json.dumps({"error": "Model is overloaded", "error_type": "overloaded"}).encode()
_JSON = [(b"content-type", b"application/json")]


def build_app(latency: float, capacity: int) -> Any:
    """The ASGI app (plain ASGI: a framework's routing would only add overhead to the measurement)."""
    stats = {"in_flight": 0, "peak": 0, "served": 0, "refused": 0, "connections": 0}
    clients: set[Any] = set()

    async def respond(send: Any, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": _JSON})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        more = True
        while more:  # read (and drop) the request body
            message = await receive()
            more = message.get("more_body", False)
        path = scope["path"]
        if scope.get("client") not in clients:
            clients.add(scope.get("client"))
            stats["connections"] = len(clients)
        if path.endswith("/stats"):
            return await respond(send, 200, json.dumps(stats).encode())
        if path.endswith("/reset"):
            clients.clear()
            stats.update(peak=0, served=0, refused=0, connections=0)
            return await respond(send, 200, b"{}")
        if stats["in_flight"] >= capacity:
            stats["refused"] += 1
            return await respond(send, 429, _OVERLOADED)
        stats["in_flight"] += 1
        stats["peak"] = max(stats["peak"], stats["in_flight"])
        try:
            await asyncio.sleep(latency)
            stats["served"] += 1
            body = {**_COMPLETION, "id": f"chatcmpl-{stats['served']}", "created": int(time.time())}
        finally:
            stats["in_flight"] -= 1
        await respond(send, 200, json.dumps(body).encode())

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per request")
    parser.add_argument("--capacity", type=int, default=32, help="requests served at once")
    args = parser.parse_args()
    uvicorn.run(
        build_app(args.latency, args.capacity),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        http="h11",
        loop="asyncio",
        backlog=4096,
    )


if __name__ == "__main__":
    main()
