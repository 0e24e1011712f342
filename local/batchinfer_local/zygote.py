"""The child side of `environments.EnvironmentPool`: one function's zygote, and its execution environments.

`python -m batchinfer_local.zygote <fd>` is the zygote server (`serve_zygotes`, started once per
Python process by `zygote_server.py`): it imports the third-party modules handlers import (`PRELOAD`) and
parses the AWS service models they use (`share_service_models`) once, then forks each function's zygote
with exactly the function's environment (the template's variables, Lambda's reserved ones, its role's
credentials) and directory. `<fd>` (the server's, then each zygote's) is an AF_UNIX SOCK_SEQPACKET socket
to its parent, one JSON message per packet. A zygote:
1. receives the function's `FunctionSpec` and answers `ready`;
2. on `spawn` (with a stream socket and the environment's own stdout and stderr pipes passed along,
   SCM_RIGHTS) forks one execution environment, which
   imports the handler itself (Lambda's INIT phase, in every environment), answers `ready` (or `failed`,
   Lambda's `Runtime.ImportModuleError`) and serves invocations on that socket one at a time (`serve`);
   `kill` ends one, `configure` changes the variables of environments forked from then on; end of
   file ends them all.
Forking after the heavy imports costs an environment ~0.15 s of CPU (its own init) instead of ~0.5 s,
and shares that memory copy-on-write. Init itself must not run in the zygote: handlers open file
descriptors at import (the shard worker's event loop: an epoll instance and its wake-up socket), which
forked environments would share. Each environment has what Lambda guarantees: its own module state
and os.environ, `cold_start` on its first invocation, a reseeded `random`. The preloaded modules open
no file and start no thread (the zygote checks for threads before forking).

Not `multiprocessing`: its spawn/forkserver children re-import the parent's `__main__` (under pytest,
pytest's entry point), and forking the parent (threads: moto, the event sources) is unsafe.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

from .functions import FunctionSpec, load_handler
from .runtime import LocalLambdaContext, Op

_PACKET_BYTES = 1 << 20
# What the handlers import that costs the most and opens nothing at import (checked: no file descriptor,
# no thread); a module that is not installed is skipped.
PRELOAD = (
    "boto3",
    "botocore.session",
    "botocore.client",
    "pydantic",
    "pydantic_settings",
    "aws_lambda_powertools",
    "aws_lambda_powertools.logging",
    "aws_lambda_powertools.tracing",
    "aws_lambda_powertools.metrics",
    "aws_lambda_powertools.event_handler",
    "aws_lambda_powertools.utilities.batch",
    "aws_lambda_powertools.utilities.parser",
    "aws_lambda_powertools.utilities.typing",
    "aws_lambda_powertools.utilities.data_classes",
    "aiohttp",
    "tenacity",
    "yaml",
    "jmespath",
)


# The services the handlers call: their models parsed once here, shared by every environment forked.
SERVICES = ("dynamodb", "s3", "sqs", "events", "secretsmanager")


def share_service_models() -> None:
    """Make botocore sessions share one loader of service models, warmed with `SERVICES`' clients.

    Each new botocore session parses the models' JSON again (about 0.15 CPU-s for these services in
    each environment, measured); Lambda pays that at every cold start, the local stack would pay it on
    the same 2 cores as the model. Clients open no connection until their first call.
    """
    import boto3
    import botocore.loaders
    import botocore.session

    botocore.session.create_loader = functools.cache(botocore.loaders.create_loader)
    session = boto3.session.Session(
        region_name="us-east-1", aws_access_key_id="preload", aws_secret_access_key="preload"
    )
    for service in SERVICES:
        session.client(service, endpoint_url="http://127.0.0.1:9")


def preload() -> None:
    """Import `PRELOAD` (a module that is not installed is skipped), then `share_service_models`."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    share_service_models()


class _RequestId(logging.Filter):
    """Stamps each record with the running invocation's request id, as the Lambda runtime does."""

    current = ""

    def filter(self, record: logging.LogRecord) -> bool:
        record.aws_request_id = self.current
        return True


def install_runtime_logging() -> None:
    """The Lambda Python runtime's root log handler: records of loggers without a handler of their own
    go to the function's log as `[LEVEL]\t<time>\t<request id>\t<message>`, at AWS_LAMBDA_LOG_LEVEL
    (the advanced logging controls' level for the runtime), else the root logger's WARNING."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(
            "[%(levelname)s]\t%(asctime)s.%(msecs)03dZ\t%(aws_request_id)s\t%(message)s", "%Y-%m-%dT%H:%M:%S"
        )
    )
    handler.addFilter(_RequestId())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(os.environ.get("AWS_LAMBDA_LOG_LEVEL", "WARNING").upper())


def error_shape(exc: BaseException, error_type: str | None = None) -> dict[str, Any]:
    """Lambda's error payload: `{"errorType", "errorMessage", "stackTrace"}`."""
    return {
        "errorType": error_type or type(exc).__name__,
        "errorMessage": str(exc),
        "stackTrace": traceback.format_exception(exc)[-12:],
    }


class Probes:
    """Counters the pool sums per function: each reply carries what changed since the last one.

    `aws:<service>.<Operation>`: calls made through `batchinfer.core.aws` clients (its `on_call` hook);
    `chaos:<fault>`: faults `batchinfer.core.chaos` injected. Modules the function never imported count
    nothing.
    """

    def __init__(self) -> None:
        self.aws_calls: Counter[str] = Counter()
        self._hooked = False
        self._last: dict[str, int] = {}

    def hook(self) -> None:
        """Count AWS calls once `batchinfer.core.aws` is imported (idempotent)."""
        aws = sys.modules.get("batchinfer.core.aws")
        if aws is not None and not self._hooked:
            aws.on_call(lambda service, operation: self.aws_calls.update([f"aws:{service}.{operation}"]))
            self._hooked = True

    def delta(self) -> dict[str, int]:
        """What changed since the last call (the first call only sets the baseline's origin)."""
        self.hook()  # a handler may import batchinfer.core.aws lazily
        now: dict[str, int] = dict(self.aws_calls)
        chaos = sys.modules.get("batchinfer.core.chaos")
        if chaos is not None:
            now.update({f"chaos:{fault}": count for fault, count in chaos.injected.items()})
        changed = {
            key: value - self._last.get(key, 0)
            for key, value in now.items()
            if value != self._last.get(key, 0)
        }
        self._last = now
        return {key: value for key, value in changed.items() if value > 0}


def apply_configuration(message: dict[str, Any]) -> None:
    """Set and unset variables, then call each dotted name (e.g. `batchinfer.core.chaos.reset`) whose
    module this process imported (nothing cached a value otherwise)."""
    os.environ.update(message.get("environ") or {})
    for name in message.get("unset") or []:
        os.environ.pop(name, None)
    for dotted in message.get("call") or []:
        parts = dotted.split(".")
        for split in range(len(parts) - 1, 0, -1):
            module = sys.modules.get(".".join(parts[:split]))
            if module is not None:
                target: Any = module
                try:
                    for attribute in parts[split:]:
                        target = getattr(target, attribute)
                except AttributeError:
                    break  # a submodule this process never imported: nothing of it is cached
                target()
                break


def serve(conn: Connection, spec: FunctionSpec) -> None:
    """One execution environment: its init, then invocations from `conn` one at a time until it closes."""
    try:
        handler = load_handler(spec)
    except BaseException as exc:
        conn.send({"op": Op.FAILED, "error": error_shape(exc, "Runtime.ImportModuleError")})
        return
    probes = Probes()
    probes.delta()
    conn.send({"op": Op.READY, "pid": os.getpid()})
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message["op"] == Op.CONFIGURE:
            apply_configuration(message)
            probes.delta()  # a reset counter is a new origin, not a negative count
            conn.send({"op": Op.CONFIGURED})
            continue
        context = LocalLambdaContext(
            spec,
            request_id=message["request_id"],
            deadline=message["deadline"],
            log_stream_name=os.environ.get("AWS_LAMBDA_LOG_STREAM_NAME"),
        )
        _RequestId.current = message["request_id"]
        started = time.monotonic()
        try:
            result = handler(json.loads(message["payload"]), context)
        except Exception as exc:
            # What the Lambda runtime writes to the function's log for an unhandled error.
            print(
                f"[ERROR] {type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc))}",
                file=sys.stderr,
                flush=True,
            )
            reply: dict[str, Any] = {"op": Op.ERROR, "error": error_shape(exc)}
        else:
            try:
                reply = {"op": Op.RESULT, "payload": json.dumps(result)}
            except (TypeError, ValueError) as exc:
                reply = {"op": Op.ERROR, "error": error_shape(exc, "Runtime.MarshalError")}
        reply.update(duration=time.monotonic() - started, stats=probes.delta())
        conn.send(reply)


def _reap(children: set[int]) -> None:
    for pid in list(children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            children.discard(pid)


def _kill(pid: int, children: set[int]) -> None:
    # Only an unreaped child: its pid cannot have been reused (a zombie still holds it).
    if pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # a killed process exits at once
        except ChildProcessError:
            pass
        children.discard(pid)


def main() -> None:
    """Run the zygote server on the socket named by argv[1] (see the module docstring)."""
    # Ctrl-C reaches the whole process group: the stack that started the zygotes ends them (and their
    # environments) by closing their control sockets, as Lambda ends environments, without tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve_zygotes(socket.socket(fileno=int(sys.argv[1])))


def serve_zygotes(control: socket.socket) -> None:
    """The zygote server: `preload` once, then fork a function's zygote per request until end of file.

    A request is `{"environ", "cwd"}` with three descriptors (the zygote's control socket, its stdout and
    stderr); the answer `{"pid"}`. The child takes exactly `environ` (the function's variables, as an
    exec would give them) and `cwd`, then runs `run_zygote`. The preloaded modules read no variable of a
    function at import (checked: AWS SDK settings are read per session), so one preload serves all.
    """
    preload()
    control.send(json.dumps({"op": Op.READY, "pid": os.getpid()}).encode())
    control.settimeout(1.0)  # wake up to reap the zygotes that ended
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, _PACKET_BYTES, 3)
        except TimeoutError:
            data, fds = None, []
        _reap_any()
        if data is None:
            continue
        if not data:
            return  # the parent closed the socket (or died): its zygotes end with their own sockets
        message = json.loads(data)
        pid = os.fork()
        if pid == 0:
            control.close()
            _become_zygote(message, fds)
        for fd in fds:
            os.close(fd)
        control.send(json.dumps({"pid": pid}).encode())


def _become_zygote(message: dict[str, Any], fds: list[int]) -> None:
    os.dup2(fds[1], 1)
    os.dup2(fds[2], 2)
    os.close(fds[1])
    os.close(fds[2])
    os.environ.clear()
    os.environ.update(message["environ"])
    os.chdir(message["cwd"])
    sys.path[0] = message["cwd"]  # as `python -m` started in the function's directory has it
    try:
        run_zygote(socket.socket(fileno=fds[0]))
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(0)


def _reap_any() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def run_zygote(control: socket.socket) -> None:
    """One function's zygote on `control` (see the module docstring), its modules preloaded."""

    def send(message: dict[str, Any]) -> None:
        control.send(json.dumps(message).encode())

    boot = json.loads(control.recv(_PACKET_BYTES))
    spec = FunctionSpec.model_validate(boot["spec"])
    logging.Formatter.converter = time.gmtime
    install_runtime_logging()
    send({"op": Op.READY, "pid": os.getpid()})
    children: set[int] = set()
    try:
        while True:
            data, fds, _, _ = socket.recv_fds(control, _PACKET_BYTES, 3)
            if not data:
                return  # the pool closed the socket (or died)
            message = json.loads(data)
            _reap(children)
            if message["op"] == Op.SPAWN:
                if threading.active_count() > 1:  # forking a threaded process could deadlock the child
                    print("zygote: threads were started during init", file=sys.stderr, flush=True)
                pid = os.fork()
                if pid == 0:
                    control.close()
                    os.dup2(fds[1], 1)  # its own log pipes (the parent's forwarders read them)
                    os.dup2(fds[2], 2)
                    os.close(fds[1])
                    os.close(fds[2])
                    os.environ["AWS_LAMBDA_LOG_STREAM_NAME"] = message["log_stream_name"]
                    if message.get("cpus"):
                        os.sched_setaffinity(0, message["cpus"])
                    try:
                        serve(Connection(fds[0]), spec)
                    except BaseException:
                        traceback.print_exc()
                    finally:
                        os._exit(0)
                for fd in fds:
                    os.close(fd)
                children.add(pid)
                send({"op": Op.SPAWNED, "pid": pid})
            elif message["op"] == Op.KILL:
                _kill(message["pid"], children)
                send({"op": Op.KILLED})
            elif message["op"] == Op.CONFIGURE:
                apply_configuration(message)
                send({"op": Op.CONFIGURED})
    finally:
        for pid in list(children):
            _kill(pid, children)


if __name__ == "__main__":
    main()
