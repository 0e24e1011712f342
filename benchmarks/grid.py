"""The throughput grid: whole batches through the local stack against simulated model servers
of every kind, side by side with the official `openai` SDK told the server's capacity C, and C/L.

Cells: both server kinds (`refusing`: 429 beyond C, as TGI; `queueing`: a FIFO beyond C, as vLLM) x
C in {8, 32, 128, 512} x L in {0.2, 1.0} s, plus a tokens-per-minute throttled server (`tpm`: a token
bucket, 429 with `retry-after-ms`, as hosted APIs). Each cell:

- a batch of n = max(20 C, 400, 8 s x C/L) requests (20 rounds or more) through the local stack (upload, then
  timed from `POST /v1/batches` to the batch seen `completed`: prepare, the shard workers, the
  aggregator), its own model name in the registry (so a cold limiter: the workers find C afresh);
- the same n requests through `AsyncOpenAI` (default transport, `max_retries=20`) with a semaphore of
  C (the TPM cell: rate x L, the oracle), in a process of its own, on the same server in the same run;
  the order alternates cell by cell (the machine drifts);
- the server's counters: longest queue over the whole run and once settled (from half to 90% of the
  answers served), refusals, peak in the server; the shard workers' RSS (max over their processes,
  sampled); AWS calls of the batch, and its cost per million requests (`aws_calls.cost_per_million`,
  the cost basis of docs/performance.md: the shard worker billed its wall time).

One stack and one server process serve the whole grid (`sim_backend`'s `/reset` sets each cell's kind
and sizes). ShardSize 5,120: one shard up to C = 128, 2 (L = 1.0) or 4 (L = 0.2) shards in
parallel at C = 512 (as many shard workers, each with its limiter, sharing the server).

    .venv/bin/python -m benchmarks.grid                       # the whole grid (about 15 minutes)
    .venv/bin/python -m benchmarks.grid --kinds queueing --cs 8,32 --ls 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import REPO, environment_rss_kb, free_port, markdown_table, server_process
from benchmarks.saturation import request_line

KINDS = ("refusing", "queueing")
CAPACITIES = (8, 32, 128, 512)
LATENCIES = (0.2, 1.0)
ROUNDS = 20
MIN_SECONDS = 8.0
SHARD_SIZE = 5120
# The TPM cell: a bucket worth TPM_RATE requests/s (of this benchmark's requests), L = TPM_LATENCY s,
# one second of burst: it needs rate x L = 40 in flight; n = 20 s of the rate.
TPM_RATE, TPM_LATENCY, TPM_BURST = 80.0, 0.5, 1.0
SDK_MAX_RETRIES = 20
WARM_MODEL = "sim-warm"


def cell_size(capacity: int, latency: float) -> int:
    """Requests of a cell's batch: at least `ROUNDS` rounds of C, 400, and `MIN_SECONDS` of the
    server's time (C/L x MIN_SECONDS: a batch's fixed cost, about a second on the local stack, is
    then a small part of it, as in any real batch)."""
    return max(ROUNDS * capacity, 400, round(MIN_SECONDS * capacity / latency))


def _body(i: int, model: str) -> dict[str, Any]:
    body = request_line(i)["body"]
    body["model"] = model
    return body


def request_cost(body: dict[str, Any]) -> float:
    """Tokens the `tpm` server takes for `body` sent as the worker sends it (compact JSON): as
    `sim_backend.Sim.chat`, len/4 + max_tokens."""
    return len(json.dumps(body, separators=(",", ":"))) / 4 + body["max_tokens"]


class Server:
    """`benchmarks.sim_backend` in its own process; `configure` resets it to a cell's kind and sizes."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Server:
        self._process = server_process(["-m", "benchmarks.sim_backend", "--port", str(self.port)], self.port)
        self._process.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.__exit__(*exc)

    def configure(self, **params: Any) -> None:
        httpx.post(f"{self.base_url}/reset", params={k: str(v) for k, v in params.items()}).raise_for_status()

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.base_url}/stats", timeout=30).json()


def settled_queue(stats: dict[str, Any], n: int) -> int:
    """The server's longest queue while it served the `n` requests' answers from 50% to 90% (its 100 ms
    series): the queue the client keeps once settled, without its startup transient."""
    return max((q for _, _, q, served in stats["series"] if 0.5 * n <= served <= 0.9 * n), default=0)


def worker_rss_mib() -> float:
    """The largest RSS among this process's shard worker execution environments (`environment_rss_kb`
    of those whose environment names the ShardWorker function), in MiB; 0 when none runs. An
    environment's RSS counts the pages it shares with the zygote (the imports)."""
    return max(environment_rss_kb(b"ShardWorker").values(), default=0) / 1024


class RssSampler(threading.Thread):
    """`worker_rss_mib()` every `interval` s while running; `.peak` and `.samples`."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval, self.samples = interval, []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.samples.append(worker_rss_mib())

    def stop(self) -> float:
        self._halt.set()
        self.join()
        return max(self.samples, default=0.0)


# ---------------------------------------------------------------------------------------- the SDK


async def _sdk(base_url: str, model: str, n: int, concurrency: int) -> dict[str, Any]:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="sim", max_retries=SDK_MAX_RETRIES, timeout=600)
    slots = asyncio.Semaphore(concurrency)
    counts = Counter[str]()

    async def one(i: int) -> None:
        async with slots:
            try:
                await client.chat.completions.create(**_body(i, model))
                counts["ok"] += 1
            except openai.APIError:
                counts["failed"] += 1

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(n)))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    await client.close()
    return {"seconds": seconds, "ok": counts["ok"], "failed": counts["failed"], "cpu_s": cpu}


def run_sdk(server: Server, model: str, n: int, concurrency: int) -> dict[str, Any]:
    """The SDK client with `concurrency` in flight, in its own process; its result and the server's
    stats."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.grid", "sdk", server.base_url, model, str(n), str(concurrency)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "server": server.stats()}


# ----------------------------------------------------------------------------------- the batch


def run_batch(stack: Any, client: Any, server: Server, model: str, n: int, directory: Path) -> dict[str, Any]:
    """An n-request batch for `model` through the local stack, timed from create to `completed`."""
    from benchmarks.embedded import wait_for

    path = directory / f"{model}.jsonl"
    path.write_bytes(
        b"".join(json.dumps({**request_line(i), "body": _body(i, model)}).encode() + b"\n" for i in range(n))
    )
    uploaded = client.upload(path)
    before = stack.stats()
    rss_before = worker_rss_mib()
    sampler = RssSampler()
    sampler.start()
    started = time.perf_counter()
    created = client.create(uploaded["id"])
    batch = wait_for(stack, client, created["id"])
    seconds = time.perf_counter() - started
    rss_peak = sampler.stop()
    stats = server.stats()
    calls = Counter(
        {
            tuple(name.removeprefix("aws:").partition(".")[::2]): count - before.get(name, 0)
            for name, count in stack.stats().items()
            if name.startswith("aws:")
        }
    )
    counts = batch["request_counts"]
    if batch["status"] != "completed" or counts["completed"] != n:
        raise RuntimeError(f"batch {created['id']} for {model}: {batch['status']}, {counts}")
    return {
        "seconds": seconds,
        "ok": counts["completed"],
        "failed": counts["failed"],
        "server": stats,
        "calls": dict(+calls),
        "rss_before_mib": rss_before,
        "rss_peak_mib": rss_peak,
    }


def _cost(batch: dict[str, Any], n: int) -> float:
    """Dollars per million requests (x86_64) of this batch: its AWS calls and its shard workers' wall
    time (each of the batch's parallel shards billed for the whole run, an upper bound)."""
    from benchmarks.aws_calls import cost_per_million

    shards = -(-n // SHARD_SIZE)
    result = {"requests": n, "counts": batch["calls"], "esm_calls": 2 * (1 + shards + 1)}
    worker_ms = 1000 * batch["seconds"] * shards / n
    return sum(dollars for _, dollars, _ in cost_per_million(result, worker_ms, "grid cell"))


def sim_registry(directory: Path, base_url: str, models: list[str]) -> Path:
    """`directory`/models.yaml naming each of `models` an `openai` backend at `base_url` (the simulated
    server's model `sim`, a 600 s timeout); its path."""
    registry = directory / "models.yaml"
    registry.write_text(
        "models:\n"
        + "".join(
            f"  {m}:\n    backend: openai\n    base_url: {base_url}\n    model: sim\n    timeout: 600\n"
            for m in models
        )
    )
    return registry


def cells(
    kinds: tuple[str, ...], capacities: tuple[int, ...], latencies: tuple[float, ...], tpm: bool
) -> list[dict[str, Any]]:
    """The grid's cells in the order they run: {kind, C, L, n, model}."""
    out = [
        {"kind": k, "C": c, "L": lat, "n": cell_size(c, lat), "model": f"sim-{k}-{c}-{lat:g}"}
        for k in kinds
        for lat in latencies
        for c in capacities
    ]
    if tpm:
        out.append({"kind": "tpm", "C": 0, "L": TPM_LATENCY, "n": int(20 * TPM_RATE), "model": "sim-tpm"})
    return out


def measure(
    kinds: tuple[str, ...] = KINDS,
    capacities: tuple[int, ...] = CAPACITIES,
    latencies: tuple[float, ...] = LATENCIES,
    tpm: bool = True,
    say: Any = print,
) -> dict[str, Any]:
    """Run the grid; per cell the batch's and the SDK's results, the server's, and the ratios."""
    from batchinfer_local import LocalStack
    from batchinfer_local.client import BatchClient
    from benchmarks.common import quiet_functions

    quiet_functions()
    grid = cells(kinds, capacities, latencies, tpm)
    rows: list[dict[str, Any]] = []
    started, loads = time.monotonic(), []
    with Server() as server, tempfile.TemporaryDirectory() as tmp:
        registry = sim_registry(Path(tmp), server.base_url, [*(c["model"] for c in grid), WARM_MODEL])
        with LocalStack(
            port=0,
            parameter_overrides={"ShardSize": str(SHARD_SIZE), "RemoteShardSize": str(SHARD_SIZE)},
            function_environment={"MODEL_REGISTRY": str(registry)},
        ) as stack:
            client = BatchClient(f"{stack.base_url}/v1", api_key=stack.api_key, timeout=300)
            # A warm stack (its functions' imports done, as a warm Lambda), and what one batch costs
            # besides its requests: a 1-request batch against a server of L = 10 ms.
            server.configure(kind="refusing", capacity=8, latency=0.01)
            overhead = run_batch(stack, client, server, WARM_MODEL, 1, Path(tmp))["seconds"]
            say(f"a 1-request batch, create to completed: {overhead:.2f} s")
            for index, cell in enumerate(grid):
                n, model = cell["n"], cell["model"]
                if cell["kind"] == "tpm":
                    cost = request_cost(_body(0, model))
                    params = {"kind": "tpm", "capacity": 0, "latency": TPM_LATENCY, "burst": TPM_BURST}
                    params["tpm"] = TPM_RATE * cost * 60
                    told = round(TPM_RATE * TPM_LATENCY)
                else:
                    params = {"kind": cell["kind"], "capacity": cell["C"], "latency": cell["L"]}
                    told = cell["C"]
                loads.append(os.getloadavg()[0])
                got: dict[str, dict[str, Any]] = {}
                for side in ("sdk", "batch") if index % 2 == 0 else ("batch", "sdk"):
                    server.configure(**params)
                    if side == "sdk":
                        got[side] = run_sdk(server, model, n, told)
                    else:
                        got[side] = run_batch(stack, client, server, model, n, Path(tmp))
                row = _row(cell, params, told, got, loads[-1])
                rows.append(row)
                say(format_row(row))
    return {"rows": rows, "seconds": time.monotonic() - started, "loads": loads, "overhead_s": overhead}


def _row(
    cell: dict[str, Any], params: dict[str, Any], told: int, got: dict[str, Any], load: float
) -> dict[str, Any]:
    batch, sdk, n = got["batch"], got["sdk"], cell["n"]
    batch_rps, sdk_rps = batch["ok"] / batch["seconds"], sdk["ok"] / sdk["seconds"]
    stats = batch["server"]
    if cell["kind"] == "tpm":
        cost = stats["tokens_spent"] / max(1, stats["served"])
        ideal = params["tpm"] / 60 / cost * (1 + TPM_BURST / batch["seconds"])
    else:
        ideal = cell["C"] / cell["L"]
    return {
        **cell,
        "told": told,
        "load": load,
        "batch_rps": batch_rps,
        "sdk_rps": sdk_rps,
        "ideal": ideal,
        "vs_sdk": batch_rps / sdk_rps,
        "vs_ideal": batch_rps / ideal,
        "sdk_vs_ideal": sdk_rps / ideal,
        "batch_seconds": batch["seconds"],
        "sdk_seconds": sdk["seconds"],
        "max_queue": stats["max_queue"],
        "settled_queue": settled_queue(stats, n),
        "peak": stats["peak"],
        "refused": stats["refused"],
        "sdk_refused": sdk["server"]["refused"],
        "sdk_cpu_ms": 1000 * sdk["cpu_s"] / n,
        "rss_before_mib": batch["rss_before_mib"],
        "rss_peak_mib": batch["rss_peak_mib"],
        "failed": batch["failed"] + sdk["failed"],
        "cost": _cost(batch, n),
        "met": batch_rps >= 0.95 * sdk_rps and batch_rps >= 0.90 * ideal,
    }


def format_row(r: dict[str, Any]) -> str:
    """One cell as a line of progress."""
    return (
        f"{r['kind']} C={r['C']} L={r['L']:g} n={r['n']}: batch {r['batch_rps']:.1f} req/s, SDK told "
        f"{r['told']} {r['sdk_rps']:.1f}, C/L {r['ideal']:.0f}; {r['vs_sdk']:.3f} of SDK, "
        f"{r['vs_ideal']:.3f} of C/L; queue {r['max_queue']} (settled {r['settled_queue']}), 429s "
        f"{r['refused']}, worker RSS {r['rss_peak_mib']:.0f} MiB, load {r['load']:.1f}"
    )


GRID_HEADER = [
    "server",
    "C",
    "L s",
    "n",
    "batch req/s",
    "SDK told C req/s",
    "C/L",
    "batch / SDK",
    "batch / (C/L)",
    "SDK / (C/L)",
    "longest queue (settled)",
    "429s (SDK's)",
    "worker RSS MiB",
    "$ per M requests",
    "met",
]


def table(rows: list[dict[str, Any]]) -> str:
    """The grid as a Markdown table (in the results file)."""
    return markdown_table(
        GRID_HEADER,
        [
            [
                r["kind"],
                str(r["C"]) if r["kind"] != "tpm" else f"(told {r['told']})",
                f"{r['L']:g}",
                f"{r['n']:,}",
                f"{r['batch_rps']:.1f}",
                f"{r['sdk_rps']:.1f}",
                f"{r['ideal']:.0f}",
                f"{r['vs_sdk']:.3f}",
                f"{r['vs_ideal']:.3f}",
                f"{r['sdk_vs_ideal']:.3f}",
                f"{r['max_queue']} ({r['settled_queue']})" if r["kind"] == "queueing" else "",
                f"{r['refused']} ({r['sdk_refused']})",
                f"{r['rss_peak_mib']:.0f}",
                f"{r['cost']:.2f}",
                "yes" if r["met"] else "**no**",
            ]
            for r in rows
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    sdk = sub.add_parser("sdk", help="one SDK run (a subprocess of the grid)")
    sdk.add_argument("base_url")
    sdk.add_argument("model")
    sdk.add_argument("n", type=int)
    sdk.add_argument("concurrency", type=int)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--cs", default=",".join(map(str, CAPACITIES)))
    parser.add_argument("--ls", default=",".join(map(str, LATENCIES)))
    parser.add_argument("--no-tpm", action="store_true")
    args = parser.parse_args()
    if args.command == "sdk":
        print(json.dumps(asyncio.run(_sdk(args.base_url, args.model, args.n, args.concurrency))))
        return
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    result = measure(
        tuple(k for k in args.kinds.split(",") if k),
        tuple(int(c) for c in args.cs.split(",") if c),
        tuple(float(x) for x in args.ls.split(",") if x),
        tpm=not args.no_tpm,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(table(result["rows"]))
    print(f"\n{len(result['rows'])} cells in {result['seconds']:.0f} s; load averages {result['loads']}")


if __name__ == "__main__":
    main()
