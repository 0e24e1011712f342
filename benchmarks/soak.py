"""Soak: a 10,000-line batch through the local stack with every fault at 5%.

    .venv/bin/python -m benchmarks.soak [--lines 10000] [--rate 0.05] [--seed 1440]

The model is the simulated OpenAI-compatible backend (benchmarks/sim_backend.py, its own process),
so the run measures the pipeline, not the model. Prints lines lost, lines duplicated, requests the
model served per line, injected faults, and time to a terminal status. Exits 1 if any line was
lost or duplicated.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import httpx

from batchinfer_local import LocalStack
from batchinfer_local.client import BatchClient
from benchmarks.common import (
    FAULTS,
    faults_fired,
    free_port,
    result_lines,
    server_process,
    sim_registry,
    write_chat_batch,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=0.05, help="probability of every fault")
    parser.add_argument("--seed", type=int, default=1440)
    args = parser.parse_args()

    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="batchinfer-soak-"))
    registry = sim_registry(workdir / "models.yaml", port)
    source = write_chat_batch(workdir / "soak.jsonl", (f"soak-{i:05d}" for i in range(args.lines)))
    # The functions' own environments (their processes), not this one's.
    functions = {
        "MODEL_REGISTRY": str(registry),
        "SHARD_LEASE_SECONDS": "2",
        "STUCK_AFTER_SECONDS": "3",
        "MAX_SHARD_ATTEMPTS": "50",
        "CHECKPOINT_SECONDS": "1",
        # AWS-side faults are the backlog benchmark's (benchmarks/backlog.py), at 2%.
        "BATCHINFER_CHAOS": json.dumps(
            {
                "seed": args.seed,
                "slow_backend_seconds": 0.2,
                **{fault: args.rate for fault in FAULTS if fault != "aws_error"},
            }
        ),
    }
    with (
        server_process(
            ["-m", "benchmarks.sim_backend", "--port", str(port), "--latency", "0.01", "--capacity", "64"],
            port,
        ),
        LocalStack(port=0, schedule_interval=1.0, function_environment=functions) as stack,
    ):
        for name in ("batchinfer", "batchinfer_local"):  # injected crashes log tracebacks by design
            logging.getLogger(name).setLevel(logging.CRITICAL)
        client = BatchClient(f"{stack.base_url}/v1", stack.api_key, timeout=120)
        started = time.monotonic()
        batch = client.create(client.upload(source)["id"])
        batch = client.wait(batch["id"], poll_s=1.0, timeout_s=3600)
        elapsed = time.monotonic() - started
        stats = httpx.get(f"http://127.0.0.1:{port}/stats").json()
        found = result_lines(client, batch)
        results = found["output"] + found["error"]
        fired = faults_fired(stack)
    expected = {f"soak-{i:05d}" for i in range(args.lines)}
    lost = len(expected - set(results))
    duplicated = sum(n - 1 for n in results.values() if n > 1)
    print(f"lines:                      {args.lines}")
    print(f"status:                     {batch['status']} {batch['request_counts']}")
    print(f"lines lost:                 {lost}")
    print(f"lines duplicated:           {duplicated}")
    print(
        f"model requests per line:    {stats['served'] / args.lines:.3f} (served {stats['served']}, "
        f"refused 429 {stats['refused']})"
    )
    print(f"faults injected:            {fired}")
    print(f"time to terminal:           {elapsed:.1f} s")
    return 0 if lost == 0 and duplicated == 0 and batch["status"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
