"""Fair shares outside the model: shard workers sharing one simulated server, each in its own
process with its own limiter, started `--stagger` s apart; each one's share of the answers.

Each worker is `batchinfer.pipeline.shard.window.run_requests` (the real `AdaptiveLimiter`, the real
`openai` backend on aiohttp, from a model registry) on `--n` requests of a shard file, as
`benchmarks.saturation.run_worker` runs one; a worker records the wall time of each answer. The share
is each worker's part of the answers over the second half of the time all of them were sending (from
the last start to the first finish), as `simulate` in tests/unit/backends/test_limiter.py counts it.

    .venv/bin/python -m benchmarks.fairness                  # 2 workers, refusing C = 32, L = 0.2 s
    .venv/bin/python -m benchmarks.fairness --workers 4 --kind queueing --capacity 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import REPO, free_port, server_process
from benchmarks.saturation import request_line


def worker(base_url: str, n: int, start: float, concurrency: int) -> dict[str, Any]:
    """One shard worker's run of `n` requests from wall time `start`: {answers (wall times), ok, failed,
    limit (its limiter's at the end), peak (most in flight)}."""
    from batchinfer.backends.registry import load_registry
    from batchinfer.core.observability import logger
    from batchinfer.pipeline.shard.limits import limiter_for
    from batchinfer.pipeline.shard.requests import parse_shard
    from batchinfer.pipeline.shard.window import run_requests

    logger.setLevel("WARNING")
    shard = b"".join(b"%d\t%s\n" % (i + 1, json.dumps(request_line(i)).encode()) for i in range(n))
    answers: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        registry = Path(tmp) / "models.yaml"
        registry.write_text(
            f"models:\n  sim-model:\n    backend: openai\n    base_url: {base_url}\n    model: sim\n"
            "    timeout: 60\n"
        )
        backend = load_registry(registry).backend("sim-model")
        chat = backend.chat_completion

        async def timed(body: dict[str, Any]) -> dict[str, Any]:
            answer = await chat(body)
            answers.append(time.time())
            return answer

        backend.chat_completion = timed  # the instance only: the worker's limiter is still keyed on it
        requests = parse_shard(shard)
        time.sleep(max(0.0, start - time.time()))
        outcomes = asyncio.run(
            run_requests(
                backend,
                requests,
                "batch_fairness",
                concurrency=concurrency,
                time_left_ms=lambda: 10**9,
                reserve_ms=0,
            )
        )
        limiter = limiter_for(backend, concurrency)
    ok = sum(1 for o in outcomes if o.ok)
    return {
        "answers": answers,
        "ok": ok,
        "failed": len(outcomes) - ok,
        "limit": limiter.limit,
        "peak": limiter.peak_in_flight,
    }


def shares(runs: list[dict[str, Any]], starts: list[float]) -> list[float]:
    """Each run's part of the answers over the second half of [last start, first finish]."""
    together = (max(starts), min(run["answers"][-1] for run in runs))
    steady = ((together[0] + together[1]) / 2, together[1])
    counts = [sum(1 for t in run["answers"] if steady[0] <= t <= steady[1]) for run in runs]
    return [count / sum(counts) for count in counts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kind", choices=("refusing", "queueing"), default="refusing")
    parser.add_argument("--capacity", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--n", type=int, default=0, help="requests per worker (default 60 C)")
    parser.add_argument("--stagger", type=float, default=1.0, help="seconds between two workers' starts")
    parser.add_argument("--concurrency", type=int, default=512, help="each worker's WorkerConcurrency")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: base URL, run one worker
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)  # where it writes its JSON (stdout has logs)
    args = parser.parse_args()
    n = args.n or 60 * args.capacity
    if args.worker:
        Path(args.out).write_text(json.dumps(worker(args.worker, n, args.start, args.concurrency)))
        return
    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    server = ["-m", "benchmarks.sim_backend", "--port", str(port), "--kind", args.kind]
    server += ["--capacity", str(args.capacity), "--latency", str(args.latency)]
    with server_process(server, port), tempfile.TemporaryDirectory() as tmp:
        first = time.time() + 3.0  # time for every worker process to import and load its registry
        starts = [first + k * args.stagger for k in range(args.workers)]
        command = [sys.executable, "-m", "benchmarks.fairness", "--worker", base_url, "--n", str(n)]
        command += ["--concurrency", str(args.concurrency)]
        outs = [Path(tmp) / f"worker{k}.json" for k in range(args.workers)]
        processes = [
            subprocess.Popen([*command, "--start", str(start), "--out", str(out)], cwd=REPO)
            for start, out in zip(starts, outs, strict=True)
        ]
        for process in processes:
            process.wait()
        runs = [json.loads(out.read_text()) for out in outs]
        stats = httpx.get(f"{base_url}/stats").json()
    seconds = max(run["answers"][-1] for run in runs) - first
    rate = sum(run["ok"] for run in runs) / seconds
    ceiling = args.capacity / args.latency
    print(
        f"{args.workers} shard workers, {n} requests each, started {args.stagger} s apart, on one "
        f"{args.kind} server C = {args.capacity}, L = {args.latency} s"
    )
    for k, (run, share) in enumerate(zip(runs, shares(runs, starts), strict=True)):
        print(
            f"  worker {k}: share {share:.3f}  ok {run['ok']}  failed {run['failed']}  "
            f"limit at the end {run['limit']}  peak in flight {run['peak']}"
        )
    print(
        f"  together: {rate:.1f} req/s = {rate / ceiling:.3f} of C/L over {seconds:.1f} s; server: "
        f"{stats['refused']} refused, peak {stats['peak']} in the server, longest queue {stats['max_queue']}"
    )


if __name__ == "__main__":
    main()
