"""Helpers shared by the benchmarks: subprocess servers on loopback, timing, the result table."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
    """A GitHub-flavoured Markdown table (what the README's Performance section holds)."""
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
