"""Backend saturation: the shard worker against a simulated backend of known capacity C/L.

The worker (`pipeline.shard.window.run_requests` with the real `openai` backend from a model registry,
on requests parsed from a shard file as prepare writes it) runs a 2,000-request batch with its
default concurrency ceiling, which is above the backend's capacity: it has to find C by itself.
The baseline is the ten-line client anyone would write, told C: asyncio + httpx, C in flight.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import Stopwatch, free_port, server_process

PROMPT = "What is the capital of France? Answer in one word."


def request_line(i: int) -> dict[str, Any]:
    """Request `i` of the benchmark batches (OpenAI batch input format)."""
    return {
        "custom_id": f"request-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "sim-model",
            "max_tokens": 16,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"{i}: {PROMPT}"},
            ],
        },
    }


@dataclass
class Run:
    """One batch through one client: wall time, successes, and what the backend saw."""

    seconds: float
    ok: int
    failed: int
    refused: int
    peak: int

    def rate(self) -> float:
        return self.ok / self.seconds


async def _plain_client(url: str, bodies: list[dict[str, Any]], in_flight: int) -> tuple[int, int]:
    # The baseline, as a user would write it: a semaphore of C around httpx posts.
    slots = asyncio.Semaphore(in_flight)
    ok = failed = 0
    async with httpx.AsyncClient(
        timeout=60, limits=httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    ) as client:

        async def one(body: dict[str, Any]) -> None:
            nonlocal ok, failed
            async with slots:
                response = await client.post(url, json=body)
                if response.status_code == 200:
                    response.json()
                    ok += 1
                else:
                    failed += 1

        await asyncio.gather(*(one(body) for body in bodies))
    return ok, failed


class SimBackend:
    """The simulated backend (`benchmarks.sim_backend`) in its own process, as a context manager."""

    def __init__(self, latency: float, capacity: int) -> None:
        self.latency, self.capacity, self.port = latency, capacity, free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> SimBackend:
        self._server = server_process(
            [
                "-m",
                "benchmarks.sim_backend",
                "--port",
                str(self.port),
                "--latency",
                str(self.latency),
                "--capacity",
                str(self.capacity),
            ],
            self.port,
        )
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)

    def reset(self) -> None:
        httpx.post(f"{self.base_url}/reset")

    def stats(self) -> dict[str, int]:
        return httpx.get(f"{self.base_url}/stats").json()

    def registry(self, directory: Path) -> Path:
        """A model registry serving `sim-model` from this backend (what a deployment would write)."""
        path = directory / "models.yaml"
        path.write_text(
            f"models:\n  sim-model:\n    backend: openai\n    base_url: {self.base_url}\n"
            f"    model: sim\n    timeout: 60\n"
        )
        return path


def run_plain(sim: SimBackend, n: int) -> Run:
    """The baseline client with exactly C in flight."""
    bodies = [request_line(i)["body"] for i in range(n)]
    sim.reset()
    with Stopwatch() as watch:
        ok, failed = asyncio.run(_plain_client(f"{sim.base_url}/chat/completions", bodies, sim.capacity))
    stats = sim.stats()
    return Run(watch.seconds, ok, failed, stats["refused"], stats["peak"])


def run_worker(sim: SimBackend, n: int, ceiling: int) -> Run:
    """`run_requests` on an n-request shard with concurrency ceiling `ceiling`."""
    from batchinfer.backends.registry import load_registry
    from batchinfer.pipeline.shard.requests import parse_shard
    from batchinfer.pipeline.shard.window import run_requests

    shard = b"".join(b"%d\t%s\n" % (i + 1, json.dumps(request_line(i)).encode()) for i in range(n))
    with tempfile.TemporaryDirectory() as tmp:
        backend = load_registry(sim.registry(Path(tmp))).backend("sim-model")
        requests = parse_shard(shard)
        sim.reset()
        with Stopwatch() as watch:
            outcomes = asyncio.run(
                run_requests(
                    backend,
                    requests,
                    "batch_bench",
                    concurrency=ceiling,
                    time_left_ms=lambda: 10**9,
                    reserve_ms=0,
                )
            )
        stats = sim.stats()
    ok = sum(1 for o in outcomes if o.ok)
    return Run(watch.seconds, ok, len(outcomes) - ok, stats["refused"], stats["peak"])


def measure(
    n: int = 2000, latency: float = 0.5, capacity: int = 48, ceiling: int | None = None, rounds: int = 5
) -> dict[str, Any]:
    """Both clients on the same simulated backend, alternating `rounds` times; each side's runs summed
    (its requests/s over all of them: throughput, as the embedded section compares totals)."""
    from batchinfer.core.settings import Settings
    from batchinfer.pipeline.shard import limits

    ceiling = ceiling or Settings.model_fields["worker_concurrency"].default
    plain_runs: list[Run] = []
    worker_runs: list[Run] = []
    cpu = 0.0
    with SimBackend(latency, capacity) as sim:
        for _ in range(rounds):
            plain_runs.append(run_plain(sim, n))
            limits._LIMITERS.clear()  # a cold worker: it finds C again
            started = time.process_time()
            worker_runs.append(run_worker(sim, n, ceiling))
            cpu += time.process_time() - started
    return {
        "n": n,
        "latency": latency,
        "capacity": capacity,
        "ceiling": ceiling,
        "limit": capacity / latency,
        "plain": _total(plain_runs),
        "worker": _total(worker_runs),
        "plain_runs": plain_runs,
        "worker_runs": worker_runs,
        "worker_cpu_ms_per_request": 1000 * cpu / (n * rounds),
    }


def _total(runs: list[Run]) -> Run:
    return Run(
        sum(r.seconds for r in runs),
        sum(r.ok for r in runs),
        sum(r.failed for r in runs),
        sum(r.refused for r in runs),
        max(r.peak for r in runs),
    )


if __name__ == "__main__":
    result = measure()
    for name in ("plain", "worker"):
        run = result[name]  # all runs summed
        print(
            f"{name:7s} {run.rate():7.1f} req/s = {run.rate() / result['limit']:.3f} of C/L "
            f"({run.seconds:.2f} s, ok {run.ok}, failed {run.failed}, 429s {run.refused}, peak {run.peak})"
        )
    print(f"worker CPU {result['worker_cpu_ms_per_request']:.2f} ms/request")
