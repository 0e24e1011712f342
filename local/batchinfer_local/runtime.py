"""Invoke functions the way Lambda does: the context, the invocation errors, what an event source drives.

The event sources (`pollers`: SQS, schedules, DynamoDB streams) and the HTTP API (`http`) drive an
`Invoker`: `environments.EnvironmentPool`, the function's execution environments, as many at once as
its concurrency allows. `Activity` counts the invocations running, for `LocalStack.wait_idle`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from aws_lambda_powertools.utilities.typing import LambdaContext

from .functions import FunctionSpec


class Op(StrEnum):
    """The kind of a message between a function's pool (`environments`) and its processes (`zygote`)."""

    BOOT = "boot"
    CONFIGURE = "configure"
    CONFIGURED = "configured"
    ERROR = "error"
    FAILED = "failed"
    INVOKE = "invoke"
    KILL = "kill"
    KILLED = "killed"
    READY = "ready"
    RESULT = "result"
    SPAWN = "spawn"
    SPAWNED = "spawned"


class LocalLambdaContext(LambdaContext):
    """The `context` argument of a local invocation (Powertools' `LambdaContext` interface).

    `get_remaining_time_in_millis()` counts down to `deadline` (a `time.monotonic()` value; default
    the function's Timeout from now), floored at 0.
    """

    def __init__(
        self,
        spec: FunctionSpec,
        request_id: str | None = None,
        deadline: float | None = None,
        log_stream_name: str | None = None,
    ) -> None:
        self._function_name = spec.function_name
        self._function_version = "$LATEST"
        self._invoked_function_arn = spec.function_arn
        self._memory_limit_in_mb = spec.memory_size
        self._aws_request_id = request_id or str(uuid.uuid4())
        self._log_group_name = f"/aws/lambda/{spec.function_name}"
        self._log_stream_name = log_stream_name or log_stream(spec)
        self._identity = None  # type: ignore[assignment]
        self._client_context = None  # type: ignore[assignment]
        self._deadline = time.monotonic() + spec.timeout if deadline is None else deadline

    def get_remaining_time_in_millis(self) -> int:  # type: ignore[override]
        """Milliseconds left before the invocation's deadline (0 once it has passed)."""
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def log_stream(spec: FunctionSpec) -> str:
    """A new execution environment's log stream name, as Lambda names them."""
    return f"{datetime.now(UTC):%Y/%m/%d}/[$LATEST]{uuid.uuid4().hex}"


class InvocationError(RuntimeError):
    """An invocation failed, as Lambda reports it: `error` is `{"errorType", "errorMessage", "stackTrace"}`
    (the handler's exception, or `Sandbox.Timedout`, `Runtime.ExitError`, `Runtime.ImportModuleError`,
    `Runtime.MarshalError`)."""

    def __init__(self, function: str, error: dict[str, Any]) -> None:
        super().__init__(f"{function}: {error.get('errorType')}: {error.get('errorMessage')}")
        self.error = error


class Throttled(RuntimeError):
    """Every execution environment of the function is busy and it may have no more (Lambda's 429)."""


class Invoker(Protocol):
    """A function the event sources can invoke (`environments.EnvironmentPool`)."""

    spec: FunctionSpec
    activity: Activity

    def invoke(self, event: Any, *, block: bool = True) -> Any:
        """Run one invocation; its JSON result. Raises `InvocationError` (and `Throttled` if not `block`)."""

    @property
    def limit(self) -> int:
        """Most invocations at once."""

    @property
    def environ(self) -> dict[str, str]:
        """The function's variables as its environments see them."""

    def count(self, name: str, by: int = 1) -> None:
        """Add to one of the function's counters (`stats`)."""


class Activity:
    """Counts running invocations; `generation` changes whenever one starts or ends.

    `LocalStack.wait_idle` uses both to know that nothing ran while it looked at the queues.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.busy = 0
        self.generation = 0

    @contextmanager
    def running(self) -> Iterator[None]:
        """Mark one unit of work as running for the duration of the block."""
        with self._lock:
            self.busy += 1
            self.generation += 1
        try:
            yield
        finally:
            with self._lock:
                self.busy -= 1
                self.generation += 1
