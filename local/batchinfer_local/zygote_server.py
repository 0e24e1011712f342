"""The process that forks every function's zygote (`zygote.serve_zygotes`), one per Python process.

Each zygote used to be an interpreter of its own that imported the handlers' heavy modules (about
1.2 CPU-s each, measured: nine per stack start, on the same 2 cores as the model and the tests). The
server imports them once for every stack this process starts, and a zygote is a fork of it given the
function's environment, directory and log pipes. A stdlib forkserver does not fit: its children
re-import the parent's `__main__` and take no environment of their own.
"""

from __future__ import annotations

import atexit
import json
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from .runtime import InvocationError

_PACKET_BYTES = 1 << 20
# Importing the modules on a loaded 2-core machine (as a zygote's init, see environments.py).
_START_TIMEOUT_SECONDS = 120.0

log = logging.getLogger(__name__)


class ZygoteServer:
    """The parent's handle of the zygote server: `fork` asks it for one function's zygote."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._control, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with child:
            self.process = subprocess.Popen(
                [sys.executable, "-u", "-m", "batchinfer_local.zygote", str(child.fileno())],
                cwd="/",  # sys.path[0]: a folder of modules would shadow the stdlib's (http.py)
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
            )
        self._control.settimeout(_START_TIMEOUT_SECONDS)
        if not self._control.recv(_PACKET_BYTES):
            raise RuntimeError(f"the zygote server exited ({self.process.wait()})")

    def fork(self, environ: Mapping[str, str], cwd: Path, fds: Sequence[int]) -> int:
        """A new zygote with exactly `environ`, in `cwd`, on `fds` (its control socket, stdout and
        stderr; the caller closes its copies): its pid.

        Raises:
            InvocationError: the server died or did not answer.
        """
        message = json.dumps({"environ": dict(environ), "cwd": str(cwd)}).encode()
        with self._lock:
            try:
                self._control.settimeout(30.0)
                socket.send_fds(self._control, [message], list(fds))
                data = self._control.recv(_PACKET_BYTES)
            except OSError as exc:
                data, error = b"", exc
            else:
                error = None
        if not data:
            reason = f"the zygote server did not answer ({error or f'exit code {self.process.poll()}'})"
            raise InvocationError("zygote-server", {"errorType": "Runtime.ExitError", "errorMessage": reason})
        return int(json.loads(data)["pid"])

    def close(self) -> None:
        """End the server (the zygotes it forked end with their own control sockets)."""
        self._control.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_server: ZygoteServer | None = None
_server_lock = threading.Lock()


def zygote_server() -> ZygoteServer:
    """This process's zygote server, started at the first call (again if it died); ended at exit."""
    global _server
    with _server_lock:
        if _server is None or _server.process.poll() is not None:
            if _server is None:
                atexit.register(_close)
            else:
                log.warning("the zygote server exited (%s): starting another", _server.process.poll())
            _server = ZygoteServer()
        return _server


def _close() -> None:
    with _server_lock:
        if _server is not None:
            _server.close()
