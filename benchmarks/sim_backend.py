"""A simulated OpenAI-compatible model server of three kinds, on a raw asyncio HTTP/1.1 server.

Kinds (all answer `POST .../chat/completions` with a fixed chat.completion after `latency` s):

- `refusing` (TGI with `max_concurrent_requests`): at most `capacity` requests in service; one more is
  answered at once with 429 `{"error": "Model is overloaded", "error_type": "overloaded"}`, no
  Retry-After.
- `queueing` (vLLM): never refuses. `capacity` slots; a request takes `latency` once it has a slot,
  the rest wait in one FIFO queue, so beyond C in flight the latency rises by L per C queued. The
  completion time of each request is computed on arrival (fixed service time, FIFO: the slot that
  frees first is the one taken longest ago, a deque of C free-times), one timer per request.
- `tpm` (hosted APIs: OpenAI, Azure, Bedrock): a token bucket over prompt + completion tokens,
  refilled at `tpm`/60 tokens/s, holding at most `burst` seconds of refill. A request costs
  len(body)/4 prompt tokens + its max_tokens (reserved at admission, as OpenAI does); when the bucket
  holds less, 429 with `retry-after-ms` (exact) and `retry-after` (whole seconds, rounded up) and an
  OpenAI rate-limit envelope. No concurrency limit (optionally `capacity` too).

Stats: `GET /stats` -> JSON {kind, capacity, latency, in_system, peak (max concurrent in the server,
queued included), max_queue, served, refused, connections, cpu_s, series: [[t, in_system, queue_max,
served]...] every 100 ms, first_at / last_at (Unix time of the first chat request received and of
the last answer sent, null before), refused_by_port {client port: 429s} (a client process is found
from its ports, `benchmarks.shapes.port_owners`)}; `POST /reset` zeroes the counters (between runs;
a bucket is refilled).
With `--record` the server also counts the chat requests it received (admitted or refused) by the
content of each one's last message: `GET /received` -> JSON {content: count} (the backlog benchmark
names each line in its message, benchmarks/backlog.py).

The server is one asyncio.Protocol per connection with a minimal HTTP/1.1 parser (keep-alive,
Content-Length bodies, no chunked uploads, no pipelining needed by the clients here): ~30 us of CPU
per request, so one core serves well over 10,000 req/s (see REPORT.md), far above what a Python
client can send.

    python -m benchmarks.sim_backend --port 8123 --kind queueing --latency 0.2 --capacity 32

`POST /reset?kind=queueing&capacity=128&latency=1.0&tpm=...` also changes the server's kind and sizes
(one server process for a whole grid). Hand-written rather than on an ASGI server: uvicorn costs ~1 ms
of CPU per request, which at C = 512, L = 0.2 (2,560 req/s) would make the server the bottleneck and
put its CPU on the machine the client is measured on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import time
from collections import Counter, deque
from urllib.parse import parse_qs

_COMPLETION_HEAD = b'{"id":"chatcmpl-'
_COMPLETION_TAIL = (
    b'","object":"chat.completion","created":1700000000,"model":"sim","choices":[{"index":0,'
    b'"finish_reason":"stop","message":{"role":"assistant","content":"Paris is the capital '
    b'of France."}}],"usage":{"prompt_tokens":24,"completion_tokens":8,"total_tokens":32}}'
)
_OVERLOADED = json.dumps({"error": "Model is overloaded", "error_type": "overloaded"}).encode()
_RATE_LIMITED = json.dumps(
    {
        "error": {
            "message": "Rate limit reached for sim in organization org-sim on "
            "tokens per min (TPM). Please try again later.",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
).encode()
_REASONS = {200: b"OK", 404: b"Not Found", 429: b"Too Many Requests", 400: b"Bad Request"}


def _response(status: int, body: bytes, extra: bytes = b"", close: bool = False) -> bytes:
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            % (status, _REASONS.get(status, b"X"), len(body)),
            extra,
            b"connection: close\r\n" if close else b"",
            b"\r\n",
            body,
        )
    )


class Sim:
    """The server's state, shared by all connections."""

    def __init__(
        self, kind: str, capacity: int, latency: float, tpm: float, burst: float, record: bool = False
    ) -> None:
        if kind not in ("refusing", "queueing", "tpm"):
            raise ValueError(kind)
        self.kind, self.capacity, self.latency = kind, capacity, latency
        self.tpm, self.burst, self.record = tpm, burst, record
        self.loop = asyncio.get_running_loop()
        self.reset()
        self.loop.call_later(0.1, self._tick)

    def reset(self, **changes: str) -> None:
        """Zero the counters (and refill the bucket); `changes` (query parameters) set the kind, capacity,
        latency, tpm or burst first. Raises ValueError for an unknown kind."""
        if "kind" in changes:
            if changes["kind"] not in ("refusing", "queueing", "tpm"):
                raise ValueError(changes["kind"])
            self.kind = changes["kind"]
        for name in ("capacity",):
            if name in changes:
                setattr(self, name, int(changes[name]))
        for name in ("latency", "tpm", "burst"):
            if name in changes:
                setattr(self, name, float(changes[name]))
        self.in_system = 0  # requests accepted and not yet answered (in service + queued)
        self.peak = self.max_queue = self.served = self.refused = 0
        self.spent = 0.0  # tpm: tokens taken from the bucket
        self.clients: set[object] = set()
        self.received: Counter[str] = Counter()  # --record: requests received by last message content
        self.slots: deque[float] = deque([0.0] * self.capacity)  # queueing: when each slot frees, FIFO
        self.tokens = self.tpm * self.burst / 60.0
        self.refilled = self.loop.time()
        self.started = self.loop.time()
        self.series: list[list[float]] = []
        self._bucket_queue_max = 0
        self.cpu0 = time.process_time()
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.refused_by_port: Counter[int] = Counter()

    def _tick(self) -> None:
        self.series.append(
            [round(self.loop.time() - self.started, 2), self.in_system, self._bucket_queue_max, self.served]
        )
        if len(self.series) > 100_000:
            del self.series[:50_000]
        self._bucket_queue_max = max(0, self.in_system - self.capacity) if self.kind == "queueing" else 0
        self.loop.call_later(0.1, self._tick)

    def stats(self) -> dict:
        return {
            "kind": self.kind,
            "capacity": self.capacity,
            "latency": self.latency,
            "tpm": self.tpm,
            "in_system": self.in_system,
            "peak": self.peak,
            "max_queue": self.max_queue,
            "served": self.served,
            "tokens_spent": round(self.spent, 1),
            "refused": self.refused,
            "connections": len(self.clients),
            "cpu_s": round(time.process_time() - self.cpu0, 3),
            "rusage_max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "series": self.series,
            "first_at": self.first_at,
            "last_at": self.last_at,
            "refused_by_port": self.refused_by_port,
        }

    def chat(self, proto: ChatProtocol, body: bytes) -> None:
        """Admit, refuse or queue one chat completion request; answer it on `proto` when done."""
        now = self.loop.time()
        if self.first_at is None:
            self.first_at = time.time()
        if self.record:  # a json.loads per request (~10 us): only when asked for
            self.received[json.loads(body)["messages"][-1]["content"]] += 1
        if self.kind == "refusing":
            if self.in_system >= self.capacity:
                self.refused += 1
                self.refused_by_port[proto.port] += 1
                proto.send(_response(429, _OVERLOADED))
                return
            done = now + self.latency
        elif self.kind == "queueing":
            free = self.slots.popleft()
            done = max(now, free) + self.latency
            self.slots.append(done)
        else:  # tpm
            rate = self.tpm / 60.0
            self.tokens = min(self.tpm * self.burst / 60.0, self.tokens + (now - self.refilled) * rate)
            self.refilled = now
            cost = len(body) / 4.0 + _max_tokens(body)
            if self.tokens < cost or (self.capacity and self.in_system >= self.capacity):
                self.refused += 1
                self.refused_by_port[proto.port] += 1
                wait = max(0.001, (cost - self.tokens) / rate)
                proto.send(
                    _response(
                        429,
                        _RATE_LIMITED,
                        b"retry-after-ms: %d\r\nretry-after: %d\r\n"
                        % (math.ceil(wait * 1000), math.ceil(wait)),
                    )
                )
                return
            self.tokens -= cost
            self.spent += cost
            done = now + self.latency
        self.in_system += 1
        if self.in_system > self.peak:
            self.peak = self.in_system
        queue = self.in_system - self.capacity
        if self.kind == "queueing" and queue > 0:
            if queue > self.max_queue:
                self.max_queue = queue
            if queue > self._bucket_queue_max:
                self._bucket_queue_max = queue
        self.loop.call_at(done, self._finish, proto)

    def _finish(self, proto: ChatProtocol) -> None:
        self.in_system -= 1
        self.served += 1
        self.last_at = time.time()
        proto.send(_response(200, b"%s%d%s" % (_COMPLETION_HEAD, self.served, _COMPLETION_TAIL)))


def _max_tokens(body: bytes) -> int:
    at = body.find(b'"max_tokens"')
    if at < 0:
        return 16
    digits = body[body.find(b":", at) + 1 : body.find(b":", at) + 12].strip()
    number = b""
    for ch in digits:
        if 48 <= ch <= 57:
            number += bytes([ch])
        elif number:
            break
    return int(number or 16)


class ChatProtocol(asyncio.Protocol):
    """One client connection: parse HTTP/1.1 requests, hand chats to `Sim`, write answers."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.close_after = False
        self.port = 0  # the client's port (its process: `refused_by_port`)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.port = (transport.get_extra_info("peername") or ("", 0))[1]
        self.sim.clients.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.sim.clients.discard(self)

    def send(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)
            if self.close_after:
                self.transport.close()

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end])
            lower = head.lower()
            length = 0
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = lower.find(b"\r\n", at + 2)
                length = int(lower[at + 17 : stop if stop >= 0 else None])
            if len(buf) < end + 4 + length:
                return
            body = bytes(buf[end + 4 : end + 4 + length])
            del buf[: end + 4 + length]
            if b"\r\nconnection: close" in lower:
                self.close_after = True
            line = head[: head.find(b"\r\n")] if b"\r\n" in head else head
            parts = line.split(b" ")
            target = parts[1] if len(parts) > 1 else b"/"
            path, _, query = target.partition(b"?")
            self.route(parts[0], path, body, query)

    def route(self, method: bytes, path: bytes, body: bytes, query: bytes = b"") -> None:
        if path.endswith(b"/chat/completions") and method == b"POST":
            self.sim.chat(self, body)
        elif path.endswith(b"/received"):
            self.send(_response(200, json.dumps(self.sim.received).encode()))
        elif path.endswith(b"/stats"):
            self.send(_response(200, json.dumps(self.sim.stats()).encode()))
        elif path.endswith(b"/reset"):
            changes = {key: values[-1] for key, values in parse_qs(query.decode()).items()}
            self.sim.reset(**changes)
            self.sim.clients.add(self)
            self.send(_response(200, b"{}"))
        else:
            self.send(_response(404, b'{"error":"not found"}'))


async def serve(
    port: int, kind: str, capacity: int, latency: float, tpm: float, burst: float, record: bool = False
) -> None:
    sim = Sim(kind, capacity, latency, tpm, burst, record)
    server = await asyncio.get_running_loop().create_server(
        lambda: ChatProtocol(sim), "127.0.0.1", port, backlog=4096, reuse_address=True
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kind", choices=("refusing", "queueing", "tpm"), default="refusing")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per request (in service)")
    parser.add_argument(
        "--capacity", type=int, default=32, help="requests in service at once (tpm: 0 = no limit)"
    )
    parser.add_argument("--tpm", type=float, default=384_000, help="tpm kind: tokens per minute")
    parser.add_argument("--burst", type=float, default=1.0, help="tpm kind: bucket size, seconds of refill")
    parser.add_argument(
        "--record", action="store_true", help="count received requests by message content (GET /received)"
    )
    args = parser.parse_args()
    try:
        asyncio.run(
            serve(args.port, args.kind, args.capacity, args.latency, args.tpm, args.burst, args.record)
        )
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
