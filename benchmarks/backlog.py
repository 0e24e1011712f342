"""Backlog: 4 accounts' 12 batches at once against a model far smaller than the demand, every fault at 2%.

    .venv/bin/python -m benchmarks.backlog [--rate 0.02] [--seed 1440] [--latency 0.06] [--probes 480]

Every batch ends, and ends right, under a backlog. Account `acct-a` submits a 20,000-line batch and two
small ones, `acct-b`..`d` three of 200 to 2,000 lines each (8,650 small lines in all), all 12 at the
same moment, to the local stack (the template's concurrency: 20 shard workers; shards of 100 lines)
against the simulated OpenAI-compatible backend (benchmarks/sim_backend.py) refusing beyond C = 8 in
service, L = 0.06 s each: at most 133 requests/s for about 29,000 lines, so every batch waits in a
backlog. Every chaos fault (`batchinfer.core.chaos`: crashes before and after a shard commit and in the
aggregator, backend 503s and slow answers, duplicate SQS deliveries, AWS-side throttling and 5xx) fires
at `--rate` per opportunity.

`crash_in_aggregator` has one opportunity per batch the aggregator finalizes: 12 batches give it
0.24 expected firings at 2%. Its opportunities, not its rate, are raised: a fifth account,
`acct-probe`, submits `--probes` one-line batches (uploaded before the clock starts), one every
`--probe-interval` s while the others run (its creation limits raised to allow it); they count for
every figure below but the four accounts' times.

Prints `lines lost: N`, `lines duplicated: N` (custom ids counted across every batch's output and
error files) and `failed without reaching the model: N` (error-file lines whose request the backend
never received: each line's user message is its custom id and the backend records what it received),
the error lines by cause, model requests per line (answered; and the backend's 429s), each
account's p50/p95 seconds from submit to terminal status, when the big batch ended against the
others, how often each fault fired, and the peak RSS of the stack (this process with moto, and every
execution environment). Exits 1 unless all three counts are 0, every
batch completed, every fault fired at least 5 times and the other accounts' batches all ended
before the big one.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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
    tree_rss_kb,
    write_chat_batch,
)

# Lines of each account's batches, submitted together; the first is the big one.
BATCHES = {
    "acct-a": (20_000, 600, 200),
    "acct-b": (2_000, 900, 300),
    "acct-c": (1_600, 700, 250),
    "acct-d": (1_200, 500, 400),
}
BIG = ("acct-a", 0)
PROBE_ACCOUNT = "acct-probe"
TERMINAL = {"completed", "failed", "expired", "cancelled"}
MIN_FIRED = 5


def percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p95) of `values` (at least one), linear interpolation between the closest ranks."""
    if len(values) == 1:
        return values[0], values[0]
    cuts = statistics.quantiles(values, n=20, method="inclusive")
    return cuts[9], cuts[18]


class Probes(threading.Thread):
    """Create a batch of `client` from each of `file_ids`, the i-th at `interval` x i s after `start()`
    (three at a time at most, so a slow answer does not delay the next ones): `.batch_ids`."""

    def __init__(self, client: BatchClient, file_ids: list[str], interval: float) -> None:
        super().__init__(daemon=True)
        self.client, self.file_ids, self.interval = client, file_ids, interval
        self.batch_ids: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        started = time.monotonic()

        def create(i: int) -> str:
            time.sleep(max(0.0, started + i * self.interval - time.monotonic()))
            return self.client.create(self.file_ids[i])["id"]

        try:
            with ThreadPoolExecutor(3) as pool:
                self.batch_ids = list(pool.map(create, range(len(self.file_ids))))
        except BaseException as error:  # reported by measure()
            self.error = error


def measure(
    rate: float = 0.02,
    seed: int = 1440,
    latency: float = 0.06,
    capacity: int = 8,
    probes: int = 480,
    probe_interval: float = 0.4,
) -> dict[str, Any]:
    """Run the backlog once (see the module docstring). Returns {"lost", "duplicated", "unreached"
    (failed without reaching the model), "causes" (error lines by code or HTTP status), "lines",
    "statuses" (batches by status), "served", "received", "refused" (the backend's counts),
    "accounts" ({account: [seconds from its submit to terminal, per batch]}), "big_end" and
    "others_end" (seconds from the submit), "fired" ({fault: count}), "rss_mib" and "rss_one_mib"
    (peaks: the stack in all, its largest process), "seconds" (wall time from the submit),
    "batches", "probes", and the arguments}. Raises TimeoutError after an hour."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="batchinfer-backlog-"))
    sources: dict[tuple[str, int], Path] = {}
    expected: dict[tuple[str, int], set[str]] = {}
    for account, sizes in BATCHES.items():
        for k, lines in enumerate(sizes):
            ids = [f"{account}-{k}-{i:05d}" for i in range(lines)]
            sources[account, k] = write_chat_batch(workdir / f"{account}-{k}.jsonl", ids)
            expected[account, k] = set(ids)
    probe_files = [
        write_chat_batch(workdir / f"probe-{j:04d}.jsonl", [f"probe-{j:04d}"]) for j in range(probes)
    ]
    functions = {  # the functions' own environments
        "MODEL_REGISTRY": str(sim_registry(workdir / "models.yaml", port)),
        # Crashed work picked up within seconds (the fault suite's lease), a sweeper looking every
        # second and calling a quiet batch stuck after 3 s (the soak's): a backlog must not be taken
        # for lost work at any of them (prepare and shards hold leases, their messages' waits count).
        "SHARD_LEASE_SECONDS": "6",
        "PREPARE_LEASE_SECONDS": "6",
        "STUCK_AFTER_SECONDS": "3",
        "CHECKPOINT_SECONDS": "1",
        "BATCHINFER_CHAOS": json.dumps(
            {"seed": seed, "slow_backend_seconds": 0.2, **{fault: rate for fault in FAULTS}}
        ),
    }
    sim = [
        *("-m", "benchmarks.sim_backend", "--port", str(port), "--record"),
        *("--kind", "refusing", "--capacity", str(capacity), "--latency", str(latency)),
    ]
    with (
        server_process(sim, port) as backend,
        LocalStack(
            port=0,
            schedule_interval=1.0,
            parameter_overrides={"ShardSize": "100", "RemoteShardSize": "100"},
            function_environment=functions,
        ) as stack,
    ):
        for name in ("batchinfer", "batchinfer_local"):  # injected crashes log tracebacks by design
            logging.getLogger(name).setLevel(logging.CRITICAL)
        from batchinfer.data import accounts  # the stack's moto, as its admin

        clients = {
            account: BatchClient(
                f"{stack.base_url}/v1", accounts.create_key(account, name="backlog")[0], timeout=120
            )
            for account in (*BATCHES, PROBE_ACCOUNT)
        }
        accounts.configure_account(
            PROBE_ACCOUNT, max_active_batches=10 * probes, max_creates_per_minute=10 * probes
        )
        with ThreadPoolExecutor(4) as pool:  # the probes' files too, before the clock starts
            file_ids = dict(
                zip(
                    sources,
                    pool.map(lambda key: clients[key[0]].upload(sources[key])["id"], sources),
                    strict=True,
                )
            )
            probe_file_ids = list(
                pool.map(lambda path: clients[PROBE_ACCOUNT].upload(path)["id"], probe_files)
            )
        gate = threading.Barrier(len(file_ids))

        def submit(key: tuple[str, int]) -> tuple[str, float]:
            gate.wait()
            submitted = time.monotonic()
            return clients[key[0]].create(file_ids[key])["id"], submitted

        with ThreadPoolExecutor(len(file_ids)) as pool:
            created = dict(zip(file_ids, pool.map(submit, file_ids), strict=True))
        started = min(at for _, at in created.values())
        prober = Probes(clients[PROBE_ACCOUNT], probe_file_ids, probe_interval)
        prober.start()

        ended: dict[tuple[str, int], float] = {}
        final: dict[tuple[str, int], dict[str, Any]] = {}
        peak_total = peak_one = 0
        while len(final) < len(created) or prober.is_alive():
            total, one = tree_rss_kb(exclude=[backend.pid])
            peak_total, peak_one = max(peak_total, total), max(peak_one, one)
            for key, (batch_id, _) in created.items():
                if key not in final:
                    batch = clients[key[0]].retrieve(batch_id)
                    if batch["status"] in TERMINAL:
                        ended[key], final[key] = time.monotonic(), batch
            if time.monotonic() - started > 3600:
                raise TimeoutError("the batches were not all terminal after an hour")
            time.sleep(1.0)
        prober.join()
        if prober.error is not None:
            raise prober.error
        probe_client = clients[PROBE_ACCOUNT]
        probe_batches = [probe_client.wait(b, poll_s=1.0, timeout_s=600) for b in prober.batch_ids]
        seconds = time.monotonic() - started
        stats = httpx.get(f"http://127.0.0.1:{port}/stats").json()
        received: dict[str, int] = httpx.get(f"http://127.0.0.1:{port}/received", timeout=60).json()
        fired = faults_fired(stack)
        with ThreadPoolExecutor(4) as pool:
            found = list(
                pool.map(
                    lambda pair: result_lines(*pair),
                    [(clients[key[0]], batch) for key, batch in final.items()]
                    + [(probe_client, batch) for batch in probe_batches],
                )
            )
    for j in range(probes):
        expected["probe", j] = {f"probe-{j:04d}"}
    keys = [*final, *(("probe", j) for j in range(len(probe_batches)))]
    lost = duplicated = unreached = 0
    causes: Counter[str] = Counter()
    for key, lines in zip(keys, found, strict=True):
        both = lines["output"] + lines["error"]
        lost += len(expected[key] - set(both))
        duplicated += sum(n - 1 for n in both.values() if n > 1)
        causes += lines["causes"]
        unreached += sum(1 for custom_id in lines["error"] if custom_id not in received)
    return {
        "lost": lost,
        "duplicated": duplicated,
        "unreached": unreached,
        "causes": dict(causes.most_common()),
        "lines": sum(len(ids) for ids in expected.values()),
        "statuses": dict(Counter(batch["status"] for batch in [*final.values(), *probe_batches])),
        "served": stats["served"],
        "received": sum(received.values()),
        "refused": stats["refused"],
        "accounts": {
            account: [ended[account, k] - created[account, k][1] for k in range(len(sizes))]
            for account, sizes in BATCHES.items()
        },
        "big_end": ended[BIG] - started,
        "others_end": max(ended[key] - started for key in final if key[0] != BIG[0]),
        "fired": {fault: fired.get(fault, 0) for fault in FAULTS},
        "rss_mib": peak_total / 1024,
        "rss_one_mib": peak_one / 1024,
        "seconds": seconds,
        "batches": len(final),
        "probes": len(probe_batches),
        "latency": latency,
        "capacity": capacity,
        "rate": rate,
    }


def problems(result: dict[str, Any]) -> list[str]:
    """What `measure`'s result fails of the benchmark's requirements (none: it passed)."""
    short = {fault: n for fault, n in result["fired"].items() if n < MIN_FIRED}
    return [
        *(["lines lost"] if result["lost"] else []),
        *(["lines duplicated"] if result["duplicated"] else []),
        *(["lines failed without reaching the model"] if result["unreached"] else []),
        *(["not every batch completed"] if set(result["statuses"]) != {"completed"} else []),
        *([f"faults fired fewer than {MIN_FIRED} times: {short}"] if short else []),
        *(
            ["another account's batch ended after the big one"]
            if result["others_end"] >= result["big_end"]
            else []
        ),
    ]


def report(result: dict[str, Any]) -> list[str]:
    """`measure`'s result as the lines the benchmark prints."""
    r = result
    lines = [
        f"batches:                           {r['batches'] + r['probes']} ({r['batches']} of 4 accounts, "
        f"{r['probes']} one-line probes), {r['lines']} lines; {r['statuses']}",
        f"backend:                           refusing, C = {r['capacity']}, L = {r['latency']} s",
        f"lines lost:                        {r['lost']}",
        f"lines duplicated:                  {r['duplicated']}",
        f"failed without reaching the model: {r['unreached']} (error lines by cause: {r['causes']})",
        f"model requests per line:           {r['served'] / r['lines']:.3f} (served {r['served']}; "
        f"received {r['received']}, refused 429 {r['refused']})",
    ]
    for account, times in r["accounts"].items():
        p50, p95 = percentiles(times)
        each = ", ".join(f"{n:,}: {t:.0f} s" for n, t in zip(BATCHES[account], times, strict=True))
        lines.append(f"{account} submit to terminal:      p50 {p50:.1f} s, p95 {p95:.1f} s ({each})")
    lines += [
        f"big batch ended:                   {r['big_end']:.1f} s after the submit; the other accounts' "
        f"last at {r['others_end']:.1f} s, {r['big_end'] - r['others_end']:.1f} s before it",
        f"faults fired (rate {r['rate']}):       {r['fired']}",
        f"peak RSS of the stack:             {r['rss_mib']:.0f} MiB in all, largest process "
        f"{r['rss_one_mib']:.0f} MiB",
        f"wall time:                         {r['seconds']:.1f} s from the submit",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=0.02, help="probability of every fault")
    parser.add_argument("--seed", type=int, default=1440)
    parser.add_argument("--latency", type=float, default=0.06, help="the backend's seconds per request")
    parser.add_argument("--capacity", type=int, default=8, help="the backend's requests in service")
    parser.add_argument("--probes", type=int, default=480, help="one-line batches of the fifth account")
    parser.add_argument("--probe-interval", type=float, default=0.4)
    args = parser.parse_args()
    result = measure(args.rate, args.seed, args.latency, args.capacity, args.probes, args.probe_interval)
    print("\n".join(report(result)))
    failures = problems(result)
    for problem in failures:
        print(f"FAILED: {problem}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
