"""Helpers shared by the benchmarks: subprocess servers on loopback, the simulated model's registry and
batches for it, what a local-stack run injected and wrote, the stack's RSS, timing, the result table."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Chaos mode's faults (`batchinfer.core.chaos.ChaosConfig`'s rates), in the order the pipeline meets them.
FAULTS = (
    "crash_before_commit",
    "crash_after_commit",
    "crash_in_aggregator",
    "backend_error",
    "slow_backend",
    "duplicate_delivery",
    "aws_error",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0, process: subprocess.Popen | None = None) -> None:
    """Return once 127.0.0.1:`port` accepts connections; raise TimeoutError (or RuntimeError if
    `process` died) otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"server process exited with {process.returncode}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s") from None
            time.sleep(0.05)


@contextmanager
def server_process(
    args: Sequence[str], port: int, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """Run `python <args>` (a loopback server listening on `port`) for the duration of the block."""
    process = subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, process=process)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto server in its own process (its memory and CPU are not the measured code's); its URL."""
    port = free_port()
    with server_process(["-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port):
        yield f"http://127.0.0.1:{port}"


def sim_registry(path: Path, port: int) -> Path:
    """Write a model registry at `path` naming one model, `sim-model`, served by the simulated
    OpenAI-compatible backend (benchmarks/sim_backend.py) on 127.0.0.1:`port`; returns `path`."""
    path.write_text(
        f"models:\n  sim-model:\n    backend: openai\n    base_url: http://127.0.0.1:{port}/v1\n"
        f"    model: sim\n    api_key: unused\n"
    )
    return path


def write_chat_batch(path: Path, custom_ids: Iterable[str], content: str | None = None) -> Path:
    """Write a batch input file at `path`: one `sim-model` chat request of 8 tokens per custom id, whose
    user message is `content` (default: the custom id itself, so a recording sim backend sees which
    line each request is); returns `path`."""
    with path.open("w") as handle:
        for custom_id in custom_ids:
            body = {
                "model": "sim-model",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": content or custom_id}],
            }
            handle.write(
                json.dumps(
                    {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
                )
                + "\n"
            )
    return path


def faults_fired(stack: Any) -> dict[str, int]:
    """The faults chaos mode injected in a LocalStack's functions since its last `reset_stats()`, by
    fault name (the stack's `chaos:<fault>` counters, event sources' duplicate deliveries included)."""
    return {
        name.removeprefix("chaos:"): count
        for name, count in stack.stats().items()
        if name.startswith("chaos:")
    }


def result_lines(client: Any, batch: dict[str, Any]) -> dict[str, Counter[str]]:
    """How many times each custom id appears in a terminal batch's output and in its error file, and
    the error file's lines by cause: {"output": Counter, "error": Counter, "causes": Counter} (a cause
    is the error's `code`, else `HTTP <status>` of the response; empty Counters for a missing file)."""
    found: dict[str, Counter[str]] = {"output": Counter(), "error": Counter(), "causes": Counter()}
    for kind in ("output", "error"):
        if batch[f"{kind}_file_id"]:
            for raw in client.content(batch[f"{kind}_file_id"]).splitlines():
                line = json.loads(raw)
                found[kind][line["custom_id"]] += 1
                if kind == "error":
                    error = line.get("error") or {}
                    response = line.get("response") or {}
                    found["causes"][error.get("code") or f"HTTP {response.get('status_code')}"] += 1
    return found


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1])
    return 0


def descendants() -> tuple[set[int], set[int]]:
    """This process's descendants from /proc (Linux): (all of them, those that are some other's
    parent). Read from /proc, not psutil: a dozen lines, and no dependency for the benchmarks alone."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # gone
                continue
    ours = {os.getpid()}
    grew = True
    while grew:  # the local stack's zygotes fork its environments
        more = {pid for pid, parent in parents.items() if parent in ours} - ours
        ours |= more
        grew = bool(more)
    ours.discard(os.getpid())
    return ours, {parents[pid] for pid in ours if pid in parents}


def environment_rss_kb(function: bytes | None = None) -> dict[int, int]:
    """RSS in KiB by pid of this process's local-stack execution environments (descendants that fork
    none), only those whose environment names `function` (a logical id, e.g. b"ShardWorker") if given.
    A process gone while read is left out."""
    found: dict[int, int] = {}
    processes, forks = descendants()
    for pid in processes - forks:
        try:
            if function is not None:
                with open(f"/proc/{pid}/environ", "rb") as environ:
                    if function not in environ.read():
                        continue
            found[pid] = _rss_kb(pid)
        except OSError:
            continue
    return found


def tree_rss_kb(exclude: Iterable[int] = ()) -> tuple[int, int]:
    """(RSS of this process plus all its descendants but `exclude`, the largest one of them), KiB. The
    sum counts the pages forked environments share with their zygote once per process: an upper bound."""
    processes, _ = descendants()
    sizes = [_rss_kb(os.getpid())]
    for pid in processes - set(exclude):
        try:
            sizes.append(_rss_kb(pid))
        except OSError:
            continue
    return sum(sizes), max(sizes)


def quiet_functions() -> None:
    """Keep the functions' INFO logs (one JSON line per shard) out of the benchmark's output: the local
    stack's functions (their lines forwarded to `batchinfer_local.function.*`) and code run in this
    process."""
    import logging

    from batchinfer.core.observability import logger

    logger.setLevel("WARNING")
    logging.getLogger("batchinfer_local.function").setLevel(logging.WARNING)


@dataclass(frozen=True)
class Row:
    """One line of the result table: `measured` and `reference` in `unit`, their `ratio` and the target."""

    figure: str
    measured: str
    reference: str
    ratio: float | None
    target: str
    met: bool | None

    def cells(self) -> list[str]:
        ratio = "" if self.ratio is None else f"{self.ratio:.3f}"
        met = {True: "yes", False: "**no**", None: ""}[self.met]
        return [self.figure, self.measured, self.reference, ratio, self.target, met]


HEADER = ["figure", "batchinfer", "reference (same run)", "ratio", "target", "met"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table (the results files' tables)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class Stopwatch:
    """Wall-clock seconds of a `with` block (`.seconds`)."""

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
