"""Three server shapes a batch must serve as fast as the `openai` SDK loop a user would write, with
where a batch's time goes, and a large batch against C/L.

Shapes (a fresh local stack at its defaults: a model on a server is sharded by RemoteShardSize, 5,000,
so each of these batches is one shard and one worker): refusing (429 beyond C) L 0.2 s C 32, 2,000
requests; refusing L 1.0 s C 128, 4,000 requests; queueing (vLLM-like) L 1.0 s C 128, 4,000 requests;
`max_tokens` 8. Each run measures every
shape's batch (upload, then timed from `POST /v1/batches` to `completed`) and the SDK with C in flight
(`benchmarks.grid.run_sdk`) on the same server, the order alternating; the figure is the median of
the runs. Then one 20,000-request batch on the small server against C/L (the fixed costs amortised;
four shards, so four workers share the server's window).

A batch's breakdown (seconds from create, Unix times compared on one machine): prepare done (its
invocation's end), the first shard worker's start, the first request at the server, the last answer,
the aggregator's start and end, `completed` seen; and the 429s each shard worker process received
(the server counts them by client port, `port_owners` finds the process of each port).

    .venv/bin/python -m benchmarks.shapes --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import markdown_table
from benchmarks.grid import Server, run_batch, run_sdk, sim_registry

# (kind, C, L seconds, requests)
SHAPES = (("refusing", 32, 0.2, 2000), ("refusing", 128, 1.0, 4000), ("queueing", 128, 1.0, 4000))
LARGE = ("refusing", 32, 0.2, 20000)
RUNS = 3
PHASES = ("prepared", "worker", "first", "last", "aggregator", "aggregated", "completed")


def port_owners() -> dict[int, int]:
    """{local TCP port: pid} of the open IPv4/IPv6 sockets of the processes this user may see (/proc)."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            inodes[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    owners: dict[int, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                owners[inodes[link[8:-1]]] = int(pid)
    return owners


class PortSampler(threading.Thread):
    """`port_owners()` every `interval` s while running, merged (a worker's connections close when its
    invocation ends): `.owners`."""

    def __init__(self, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.interval, self.owners = interval, {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.owners.update(port_owners())

    def stop(self) -> dict[int, int]:
        self._halt.set()
        self.join()
        self.owners.update(port_owners())
        return self.owners


class Invocations:
    """Every function invocation of the in-process local stack as (logical id, start, end) in Unix
    time: `EnvironmentPool.invoke` wrapped while installed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, float]] = []

    def install(self) -> None:
        from batchinfer_local.environments import EnvironmentPool

        original, calls = EnvironmentPool.invoke, self.calls

        def invoke(pool: Any, event: Any, *, block: bool = True) -> Any:
            started = time.time()
            try:
                return original(pool, event, block=block)
            finally:
                calls.append((pool.spec.logical_id, started, time.time()))

        EnvironmentPool.invoke = invoke  # type: ignore[method-assign]

    def since(self, at: float, function: str) -> list[tuple[float, float]]:
        """(start, end) of `function`'s invocations started at or after `at`."""
        return [(s, e) for name, s, e in list(self.calls) if name == function and s >= at]


def breakdown(calls: Invocations, created: float, done: float, server: dict[str, Any]) -> dict[str, float]:
    """Seconds from create to each of `PHASES` of one batch (None when it did not happen)."""
    prepare = calls.since(created - 0.5, "PrepareFunction")  # its clock may start after the API call
    workers = calls.since(created, "ShardWorkerFunction")
    last = server["last_at"] or done
    aggregator = [c for c in calls.since(created, "AggregatorFunction") if c[1] >= last]
    at = {
        "prepared": prepare[0][1] if prepare else None,
        "worker": min((s for s, _ in workers), default=None),
        "first": server["first_at"],
        "last": server["last_at"],
        "aggregator": aggregator[0][0] if aggregator else None,
        "aggregated": aggregator[-1][1] if aggregator else None,
        "completed": done,
    }
    return {k: (v - created if v is not None else None) for k, v in at.items()}


def refused_by_worker(server: dict[str, Any], owners: dict[int, int]) -> list[int]:
    """429s per client process (largest first); a closed connection's port counts as its own."""
    by_pid: Counter[int] = Counter()
    for port, count in server["refused_by_port"].items():
        by_pid[owners.get(int(port), -int(port))] += count
    return sorted(by_pid.values(), reverse=True)


def one_batch(stack: Any, client: Any, server: Server, calls: Invocations, model: str, n: int, tmp: Path):
    """A batch through the stack with its breakdown and 429s per worker."""
    sampler = PortSampler()
    sampler.start()
    batch = run_batch(stack, client, server, model, n, tmp)
    done = time.time()
    owners = sampler.stop()
    created = done - batch["seconds"]  # its clock starts at `POST /v1/batches`, after the upload
    stats = batch["server"]
    return {
        "rps": n / batch["seconds"],
        "seconds": batch["seconds"],
        "phases": breakdown(calls, created, done, stats),
        "refused": refused_by_worker(stats, owners),
        "workers": len(calls.since(created, "ShardWorkerFunction")),
        "aggregations": len(calls.since(created, "AggregatorFunction")),
    }


def measure(runs: int = RUNS, large: bool = True, say: Any = print) -> dict[str, Any]:
    """Run the shapes `runs` times (and the large batch once); per shape every run's batch and SDK."""
    from batchinfer_local import LocalStack
    from batchinfer_local.client import BatchClient
    from benchmarks.common import quiet_functions

    quiet_functions()
    calls = Invocations()
    calls.install()
    models = {shape: f"sim-{shape[0]}-{shape[1]}-{shape[2]:g}" for shape in (*SHAPES, LARGE)}
    got: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    with Server() as server, tempfile.TemporaryDirectory() as tmp:
        registry = sim_registry(Path(tmp), server.base_url, [*models.values(), "sim-warm"])
        with LocalStack(port=0, function_environment={"MODEL_REGISTRY": str(registry)}) as stack:
            client = BatchClient(f"{stack.base_url}/v1", api_key=stack.api_key, timeout=300)
            server.configure(kind="refusing", capacity=8, latency=0.01)
            warm = one_batch(stack, client, server, calls, "sim-warm", 1, Path(tmp))
            say(f"a 1-request batch: {warm['seconds']:.2f} s, {_phases(warm['phases'])}")
            for run in range(runs):
                for index, shape in enumerate(SHAPES):
                    kind, capacity, latency, n = shape
                    row: dict[str, Any] = {"load": os.getloadavg()[0]}
                    for side in ("sdk", "batch") if (run + index) % 2 == 0 else ("batch", "sdk"):
                        server.configure(kind=kind, capacity=capacity, latency=latency)
                        if side == "sdk":
                            sdk = run_sdk(server, models[shape], n, capacity)
                            row["sdk_rps"] = sdk["ok"] / sdk["seconds"]
                        else:
                            row["batch"] = one_batch(
                                stack, client, server, calls, models[shape], n, Path(tmp)
                            )
                    got[shape].append(row)
                    say(f"run {run + 1} {_label(shape)}: {_line(row)}")
            big = None
            if large:
                kind, capacity, latency, n = LARGE
                server.configure(kind=kind, capacity=capacity, latency=latency)
                big = one_batch(stack, client, server, calls, models[LARGE], n, Path(tmp))
                say(
                    f"{_label(LARGE)}: {big['rps']:.1f} req/s of C/L {capacity / latency:.0f}, "
                    f"{_phases(big['phases'])}"
                )
    return {"shapes": got, "large": big, "warm": warm}


def summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per shape: the medians of the runs (batch, SDK, ratio) and the median run's breakdown."""
    out = []
    for shape, rows in result["shapes"].items():
        ratios = [r["batch"]["rps"] / r["sdk_rps"] for r in rows]
        middle = sorted(rows, key=lambda r: r["batch"]["rps"] / r["sdk_rps"])[len(rows) // 2]
        out.append(
            {
                "shape": shape,
                "batch_rps": statistics.median(r["batch"]["rps"] for r in rows),
                "sdk_rps": statistics.median(r["sdk_rps"] for r in rows),
                "ratio": statistics.median(ratios),
                "ratios": ratios,
                "median_run": middle,
            }
        )
    return out


def report(result: dict[str, Any], rows: list[Any], notes: list[str]) -> str:
    """`make bench`'s rows (each shape's median against the SDK's, >= 0.95; the large batch against
    C/L, >= 0.95) and note; returns the shapes' table with their breakdown."""
    from benchmarks.common import Row

    shapes = summary(result)
    for r in shapes:
        rows.append(
            Row(
                f"shapes: {_label(r['shape'])}, median of {len(r['ratios'])} runs vs the SDK told C",
                f"{r['batch_rps']:.1f} req/s",
                f"{r['sdk_rps']:.1f} req/s",
                r["ratio"],
                ">= 0.95",
                r["ratio"] >= 0.95,
            )
        )
    big = result["large"]
    if big:
        ideal = LARGE[1] / LARGE[2]
        rows.append(
            Row(
                f"shapes: {_label(LARGE)} vs C/L",
                f"{big['rps']:.1f} req/s",
                f"C/L {ideal:.0f} req/s",
                big["rps"] / ideal,
                ">= 0.95",
                big["rps"] / ideal >= 0.95,
            )
        )
        notes.append(f"shapes: the {LARGE[3]:,}-request batch's breakdown: {_phases(big['phases'])}")
    warm = result["warm"]
    notes.append(
        f"shapes: seconds from create (a 1-request batch: {_phases(warm['phases'])}); 429s per worker "
        "process, largest first (a port whose process was not seen counts alone)"
    )
    return table(shapes)


def _label(shape: tuple) -> str:
    kind, capacity, latency, n = shape
    return f"{kind} L {latency:g} s C {capacity}, {n:,} requests"


def _phases(phases: dict[str, float | None]) -> str:
    return ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in phases.items())


def _line(row: dict[str, Any]) -> str:
    batch = row["batch"]
    return (
        f"batch {batch['rps']:.1f} req/s, SDK {row['sdk_rps']:.1f}, "
        f"ratio {batch['rps'] / row['sdk_rps']:.3f}; {_phases(batch['phases'])}; {batch['workers']} worker "
        f"and {batch['aggregations']} aggregator invocations, 429s per worker {batch['refused']}; "
        f"load {row['load']:.1f}"
    )


def table(rows: list[dict[str, Any]]) -> str:
    """The shapes' medians and the median run's breakdown as a Markdown table."""
    return markdown_table(
        ["server", "batch req/s", "SDK told C req/s", "batch / SDK (runs)", *PHASES, "429s per worker"],
        [
            [
                _label(r["shape"]),
                f"{r['batch_rps']:.1f}",
                f"{r['sdk_rps']:.1f}",
                f"**{r['ratio']:.3f}** ({', '.join(f'{x:.2f}' for x in r['ratios'])})",
                *(f"{v:.2f}" if v is not None else "-" for v in r["median_run"]["batch"]["phases"].values()),
                ", ".join(map(str, r["median_run"]["batch"]["refused"])) or "0",
            ]
            for r in rows
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--no-large", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    result = measure(args.runs, not args.no_large, say=lambda line: print(line, file=sys.stderr, flush=True))
    print(table(summary(result)))
    if result["large"]:
        big = result["large"]
        print(f"\n{_label(LARGE)}: {big['rps']:.1f} req/s, {big['rps'] / (LARGE[1] / LARGE[2]):.3f} of C/L")


if __name__ == "__main__":
    main()
