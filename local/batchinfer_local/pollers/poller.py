"""`Poller`: the base of every event source mapping (one per function and declared source).

A poller is a daemon thread that reads its source until the stack stops and invokes its function;
invocations it runs on threads of their own are tracked so that stopping can wait for them. The
partial batch response (`batchItemFailures`) is read here, by the rules SQS and stream mappings share:
https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html and
https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..functions import DynamoDbEventSpec, ScheduleEventSpec, SqsEventSpec
from ..runtime import Invoker

log = logging.getLogger(__name__)


def reported_failures(result: Any, identifiers: list[str]) -> set[str] | None:
    """The `itemIdentifier`s a handler's partial batch response reports failed, from `identifiers`
    (the batch's message ids or sequence numbers).

    A null or empty response or `batchItemFailures` is complete success (an empty set). None when the
    whole batch failed: a response that is not an object, a `batchItemFailures` that is not a list, or
    an entry whose identifier is missing, empty or not one of `identifiers`.
    """
    if result is None:
        return set()
    if not isinstance(result, dict):
        log.warning("partial batch response is not an object (%r): the whole batch failed", result)
        return None
    failures = result.get("batchItemFailures")
    if not failures:
        return set()
    if not isinstance(failures, list):
        log.warning("batchItemFailures is not a list: the whole batch failed")
        return None
    known, failed = set(identifiers), set()
    for item in failures:
        identifier = item.get("itemIdentifier") if isinstance(item, dict) else None
        if not identifier or identifier not in known:
            log.warning("invalid batchItemFailures entry %r: the whole batch failed", item)
            return None
        failed.add(identifier)
    return failed


class Poller(threading.Thread, ABC):
    """One event source mapping of `function`: a daemon thread named `<kind>-<LogicalId>-<event name>`.

    `run` (the subclass's) polls until `stopping` is set; invocations started with `_spawn` run on
    threads of their own, which `join_batches` waits for when the stack stops.
    """

    def __init__(
        self,
        kind: str,
        function: Invoker,
        source: SqsEventSpec | ScheduleEventSpec | DynamoDbEventSpec,
        stopping: threading.Event,
    ) -> None:
        super().__init__(name=f"{kind}-{function.spec.logical_id}-{source.name}", daemon=True)
        self.function = function
        self._stopping = stopping
        self._batches: list[threading.Thread] = []

    @abstractmethod
    def run(self) -> None:
        """Poll until the stack stops; errors are logged and polling continues."""

    def join_batches(self, timeout: float) -> list[threading.Thread]:
        """Wait up to `timeout` seconds in all for the invocations in flight; those still running."""
        deadline = time.monotonic() + timeout
        for thread in list(self._batches):
            thread.join(max(0.0, deadline - time.monotonic()))
        return [thread for thread in self._batches if thread.is_alive()]

    def _spawn(self, target: Callable[..., None], argument: Any, suffix: str) -> None:
        """Run `target(argument)` on a thread of its own, tracked for `join_batches`."""
        thread = threading.Thread(target=target, args=(argument,), daemon=True, name=f"{self.name}-{suffix}")
        self._batches = [running for running in self._batches if running.is_alive()] + [thread]
        thread.start()
