"""A local stack started the way a user starts it, as a subprocess (`make local`, `batchinfer local`),
for the tests that run the documentation's commands as written."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_up(
    url: str, stack: subprocess.Popen[bytes], timeout: float = 240, ready: Callable[[], bool] = lambda: True
) -> None:
    """Return once `url`/openapi.json answers 200 and `ready()` holds; AssertionError if `stack` exits
    first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert stack.poll() is None, f"the local stack exited with {stack.returncode}"
        try:
            if ready() and httpx.get(f"{url}/openapi.json", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the local stack did not answer at {url} within {timeout} s")


def stop(stack: subprocess.Popen[bytes]) -> None:
    """Stop `stack` (started with `start_new_session=True`) as Ctrl-C does; kill it after 60 s."""
    os.killpg(stack.pid, signal.SIGINT)
    try:
        stack.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(stack.pid, signal.SIGKILL)
        stack.wait()
