"""A function's execution environments as OS processes, as many at once as its concurrency allows.

Like Lambda (https://docs.aws.amazon.com/lambda/latest/dg/lambda-runtime-environment.html): an
environment runs one invocation at a time; a busy function gets a new environment (a cold start)
until it has `limit` of them, and further invocations wait (or, for `block=False`, are throttled);
idle environments are reused warm. Each environment is a process of its own, so it has its own module
state and `os.environ` (the function's variables, Lambda's reserved ones, its role's credentials). An
invocation still running at its deadline (the function's Timeout) kills its environment
("Task timed out"); one that ends the process fails with `Runtime.ExitError`; a failed init
(`Runtime.ImportModuleError`) fails the invocation and is retried by the next one.

Each function has a zygote (`zygote.py`): a process with exactly the function's environment that has
the handlers' heavy third-party modules imported (forked from this process's zygote server,
`zygote_server.py`, which imported them once); environments are forked from it on demand and each
runs the handler's init itself.
Each reply carries the environment's counters (`zygote.Probes`), summed in `stats`; `configure`
changes the function's variables in every environment before its next invocation. Each process's
stdout and stderr (the function's log; each environment has pipes of its own, as it has a log stream
of its own on Lambda) are forwarded to the logger `batchinfer_local.function.<LogicalId>`,
each line at its level (a Powertools JSON line's `level`, a Lambda runtime line's `[LEVEL]`; else INFO
for stdout, WARNING for stderr).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import IO, Any

from .functions import FunctionSpec
from .runtime import Activity, InvocationError, Op, Throttled, log_stream
from .zygote_server import zygote_server

log = logging.getLogger(__name__)

FUNCTION_LOGGER = "batchinfer_local.function"
# A zygote's init may take a while on a loaded 2-core machine (Lambda allows 10 s, then retries).
INIT_TIMEOUT_SECONDS = 120.0
# Time the reply of an invocation that returned just before its deadline may take to arrive.
_REPLY_GRACE_SECONDS = 0.25
_PACKET_BYTES = 1 << 20


@dataclass(frozen=True)
class PoolStats:
    """What a function's environments did: `invocations` started, `peak` of invocations at once,
    `environments` created (cold starts), `limit` (most environments at once)."""

    invocations: int
    peak: int
    environments: int
    limit: int


def _level(line: str, default: int) -> int:
    """The level of a Powertools JSON line (`"level"`) or a Lambda runtime line (`[LEVEL]\t...`)."""
    name = ""
    if line.startswith("{") and '"level"' in line:
        try:
            name = str(json.loads(line).get("level", ""))
        except (ValueError, AttributeError):
            return default
    elif line.startswith("[") and "]" in line[:12]:
        name = line[1 : line.index("]")]
    level = logging.getLevelName(name.upper()) if name else default
    return level if isinstance(level, int) else default


def _forward(stream: IO[bytes], logger: logging.Logger, default: int) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line:
            logger.log(_level(line, default), "%s", line)
    stream.close()


def forward_log(
    stdout: IO[bytes], stderr: IO[bytes], logger: logging.Logger, name: str
) -> list[threading.Thread]:
    """Start the two threads that forward a process's stdout (INFO) and stderr (WARNING) line by line."""
    readers = [
        threading.Thread(
            target=_forward, args=(pipe, logger, level), daemon=True, name=f"log-{name}-{stream}"
        )
        for pipe, level, stream in ((stdout, logging.INFO, "stdout"), (stderr, logging.WARNING, "stderr"))
    ]
    for reader in readers:
        reader.start()
    return readers


class _Zygote:
    """The parent's handle of one function's zygote (its control socket, its log readers), a process
    forked by this process's zygote server (`zygote_server.py`)."""

    def __init__(self, spec: FunctionSpec, environ: Mapping[str, str], logger: logging.Logger) -> None:
        self.spec = spec
        self._lock = threading.Lock()
        self._control, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.pid = zygote_server().fork(environ, spec.handler_file.parent, [child.fileno(), out_w, err_w])
        except InvocationError:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            child.close()
            os.close(out_w)
            os.close(err_w)
        self._readers = forward_log(
            os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"), logger, f"{spec.logical_id}-zygote"
        )
        try:
            self.request(
                {"op": Op.BOOT, "spec": spec.model_dump(mode="json", by_alias=True)},
                timeout=INIT_TIMEOUT_SECONDS,
            )
        except InvocationError:
            self.close()
            raise

    def alive(self) -> bool:
        """False once the zygote has ended (its end of the control socket closed)."""
        with self._lock:
            poller = select.poll()
            poller.register(self._control, select.POLLIN | select.POLLHUP)
            return not poller.poll(0)

    def request(
        self, message: dict[str, Any], fds: Iterable[int] = (), timeout: float = 30.0
    ) -> dict[str, Any]:
        """Send one control message (with file descriptors) and return the zygote's answer.

        Raises:
            InvocationError: the zygote died or did not answer within `timeout` seconds.
        """
        with self._lock:
            try:
                self._control.settimeout(timeout)
                socket.send_fds(self._control, [json.dumps(message).encode()], list(fds))
                data = self._control.recv(_PACKET_BYTES)
            except OSError as exc:  # socket.timeout included
                data, error = b"", exc
            else:
                error = None
        if not data:
            reason = f"no answer to {message['op']} ({error or 'the zygote exited'})"
            raise InvocationError(
                self.spec.logical_id, {"errorType": "Runtime.ExitError", "errorMessage": reason}
            )
        return json.loads(data)

    def close(self) -> None:
        """End the zygote and every environment forked from it; wait for its log to be forwarded (its
        pipes end once it and its environments have exited)."""
        self._control.close()  # end of file: the zygote kills its environments and exits
        for reader in self._readers:
            reader.join(timeout=10)
        if any(reader.is_alive() for reader in self._readers):
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for reader in self._readers:
                reader.join(timeout=5)


class _Environment:
    """The parent's handle of one execution environment: its process id and its connection."""

    def __init__(self, number: int, pid: int, conn: Connection, generation: int) -> None:
        self.number, self.pid, self.conn, self.generation = number, pid, conn, generation


class EnvironmentPool:
    """The execution environments of one function (see the module docstring).

    Args:
        spec: the function.
        environ: the environments' variables, exactly (nothing is inherited from this process).
        activity: counts this function's invocations for `LocalStack.wait_idle`.
        limit: most environments at once (ReservedConcurrentExecutions, or a local default).
        share_cpus: an environment that starts while others of the function are alive is pinned to one
            of the CPUs this process may use (round-robin); one that starts alone gets them all. Code
            sizing its threads by the CPUs it may use (llama.cpp: `llama_engine.usable_cpus`) then runs N
            single-threaded copies on N concurrent environments instead of N x CPUs threads on a few
            cores, while a lone environment (`make demo`) still uses every core.
    """

    def __init__(
        self,
        spec: FunctionSpec,
        environ: Mapping[str, str],
        activity: Activity,
        *,
        limit: int,
        share_cpus: bool = False,
    ) -> None:
        self.spec, self.activity = spec, activity
        self._environ = dict(environ)
        self._limit = limit
        self._share_cpus = share_cpus
        self._logger = logging.getLogger(f"{FUNCTION_LOGGER}.{spec.logical_id}")
        self._cond = threading.Condition()
        self._idle: list[_Environment] = []
        self._alive = 0  # environments running or starting
        self._created = 0
        self._invocations = self._in_flight = self._peak = 0
        self._stats: Counter[str] = Counter()
        self._zygote_lock = threading.Lock()
        self._log_readers: list[threading.Thread] = []
        self._zygote: _Zygote | None = None
        self._controls: list[dict[str, Any]] = []
        self._closed = False

    # ---------------------------------------------------------- what the stack and the event sources see
    @property
    def limit(self) -> int:
        """Most environments (and so invocations) at once."""
        return self._limit

    @property
    def environ(self) -> dict[str, str]:
        """The variables the function's environments have (after `configure`)."""
        with self._cond:
            return dict(self._environ)

    @property
    def invocations(self) -> int:
        """Invocations started since the pool was made."""
        return self._invocations

    def pool_stats(self) -> PoolStats:
        """Invocations, their high-water mark, cold starts and the limit."""
        with self._cond:
            return PoolStats(self._invocations, self._peak, self._created, self._limit)

    def stats(self) -> Counter[str]:
        """The environments' counters (`zygote.Probes`) and the event sources', summed."""
        with self._cond:
            return Counter(self._stats)

    def count(self, name: str, by: int = 1) -> None:
        """Add `by` to the counter `name` of `stats`."""
        with self._cond:
            self._stats[name] += by

    def reset_stats(self) -> None:
        """Start `stats` from nothing again."""
        with self._cond:
            self._stats.clear()

    def configure(
        self, environ: Mapping[str, str] | None = None, unset: Iterable[str] = (), call: Iterable[str] = ()
    ) -> None:
        """Set `environ` and remove `unset` in every environment before its next invocation (and in
        those created later), then call each dotted name in `call` there (e.g. a cache's `cache_clear`)."""
        message = {
            "op": Op.CONFIGURE,
            "environ": dict(environ or {}),
            "unset": list(unset),
            "call": list(call),
        }
        with self._zygote_lock:
            with self._cond:
                self._environ.update(message["environ"])
                for name in message["unset"]:
                    self._environ.pop(name, None)
                self._controls.append(message)
            if self._zygote is not None:
                try:
                    self._zygote.request(message)
                except InvocationError:
                    self._discard_zygote()

    def invoke(self, event: Any, *, block: bool = True) -> Any:
        """One invocation of the function with `event`; the handler's result (a JSON copy).

        Raises:
            InvocationError: the handler raised, timed out, ended its process or its init failed.
            Throttled: `block` is False and every environment is busy.
            TypeError: `event` is not JSON-serializable.
        """
        payload = json.dumps(event)  # Lambda hands the handler a freshly parsed copy
        with self.activity.running():
            environment = self._acquire(block)
            keep = False
            with self._cond:
                self._invocations += 1
                self._in_flight += 1
                self._peak = max(self._peak, self._in_flight)
            try:
                reply = self._call(environment, payload)
                keep = True  # a handler's error leaves its environment as it is, as in Lambda
            finally:
                with self._cond:
                    self._in_flight -= 1
                self._release(environment, keep)
        if reply["op"] == Op.ERROR:
            raise InvocationError(self.spec.logical_id, reply["error"])
        return json.loads(reply["payload"])

    def warm(self) -> None:
        """Start one environment (its init) now rather than at the first invocation, if none exists.

        An init that fails is logged; the first invocation runs it again and fails with its error.
        """
        with self._cond:
            if self._alive or self._closed:
                return
        try:
            self._release(self._acquire(block=False), keep=True)
        except (InvocationError, Throttled) as error:
            log.warning("%s", error)

    def close(self) -> None:
        """End every environment and the zygote (invocations still running fail with Runtime.ExitError)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for environment in idle:
            environment.conn.close()
        with self._zygote_lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None
            for reader in self._log_readers:  # the environments' last lines
                reader.join(timeout=5)

    # ------------------------------------------------------------------ internals
    def _acquire(self, block: bool) -> _Environment:
        with self._cond:
            while True:
                if self._closed:
                    raise InvocationError(
                        self.spec.logical_id,
                        {"errorType": "Runtime.ExitError", "errorMessage": "the local stack is stopping"},
                    )
                if self._idle:
                    return self._idle.pop()  # the most recently used: warmest
                if self._alive < self._limit:
                    self._alive += 1
                    number, alone = self._created, self._alive == 1
                    self._created += 1
                    break
                if not block:
                    raise Throttled(f"{self.spec.logical_id}: all {self._limit} environments are busy")
                self._cond.wait()
        try:
            return self._spawn(number, alone)
        except BaseException:
            with self._cond:
                self._alive -= 1
                self._cond.notify()
            raise

    def _release(self, environment: _Environment, keep: bool) -> None:
        with self._cond:
            if keep and not self._closed:
                self._idle.append(environment)
            else:
                self._alive -= 1
                environment.conn.close()
            self._cond.notify()

    def _spawn(self, number: int, alone: bool) -> _Environment:
        with self._zygote_lock:
            if self._zygote is None or not self._zygote.alive():
                self._zygote = _Zygote(self.spec, self.environ, self._logger)
            zygote = self._zygote
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            # Its own stdout and stderr, as each Lambda environment has its own log stream: environments
            # sharing the zygote's pipe interleaved one's line into another's (print writes the text and
            # its newline in two writes).
            (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
            with theirs:
                cpus = self._cpus(number) if self._share_cpus and not alone else None
                message = {"op": Op.SPAWN, "log_stream_name": log_stream(self.spec), "cpus": cpus}
                try:
                    pid = zygote.request(message, fds=[theirs.fileno(), out_w, err_w])["pid"]
                except InvocationError:
                    mine.close()
                    for fd in (out_r, err_r):
                        os.close(fd)
                    self._discard_zygote()
                    raise
                finally:
                    os.close(out_w)
                    os.close(err_w)
                readers = forward_log(
                    os.fdopen(out_r, "rb"),
                    os.fdopen(err_r, "rb"),
                    self._logger,
                    f"{self.spec.logical_id}-{pid}",
                )
                self._log_readers = [reader for reader in self._log_readers if reader.is_alive()] + readers
            with self._cond:
                generation = len(self._controls)
        conn = Connection(mine.detach())
        if not conn.poll(INIT_TIMEOUT_SECONDS):
            conn.close()
            raise InvocationError(
                self.spec.logical_id,
                {"errorType": "Runtime.ExitError", "errorMessage": "the environment did not start"},
            )
        try:
            ready = conn.recv()
        except (EOFError, OSError):
            conn.close()
            raise InvocationError(
                self.spec.logical_id,
                {"errorType": "Runtime.ExitError", "errorMessage": "the environment did not start"},
            ) from None
        if ready["op"] == Op.FAILED:  # its init failed; it exits (Lambda runs init again next time)
            conn.close()
            raise InvocationError(self.spec.logical_id, ready["error"])
        return _Environment(number, pid, conn, generation)

    def _discard_zygote(self) -> None:
        # Holding _zygote_lock.
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def _cpus(self, number: int) -> list[int] | None:
        usable = sorted(os.sched_getaffinity(0))
        return [usable[number % len(usable)]] if len(usable) > 1 else None

    def _kill(self, environment: _Environment) -> None:
        with self._zygote_lock:
            if self._zygote is not None:
                try:
                    self._zygote.request({"op": Op.KILL, "pid": environment.pid})
                except InvocationError:
                    self._discard_zygote()

    def _call(self, environment: _Environment, payload: str) -> dict[str, Any]:
        """The reply to one invocation in `environment` (InvocationError: the environment is gone)."""
        conn, name = environment.conn, self.spec.logical_id
        try:
            with self._cond:
                pending = self._controls[environment.generation :]
            for control in pending:
                conn.send(control)
                conn.recv()
                environment.generation += 1
            timeout = self.spec.timeout
            conn.send(
                {
                    "op": Op.INVOKE,
                    "payload": payload,
                    "request_id": str(uuid.uuid4()),
                    "deadline": time.monotonic() + timeout,
                }
            )
            if not conn.poll(timeout + _REPLY_GRACE_SECONDS):
                self._kill(environment)
                raise InvocationError(
                    name,
                    {
                        "errorType": "Sandbox.Timedout",
                        "errorMessage": f"Task timed out after {timeout:.2f} seconds",
                    },
                )
            reply = conn.recv()
        except (EOFError, OSError):
            self._kill(environment)
            raise InvocationError(
                name, {"errorType": "Runtime.ExitError", "errorMessage": "the environment's process ended"}
            ) from None
        with self._cond:
            self._stats.update(reply.get("stats") or {})
        return reply
