"""Watching a batch while it runs: the model's own log of what it answered, GET
polled into a series of snapshots, and the checks on that series.

`AnswerLog` reads the embedded backend's own debug line ("llama.cpp answered", with the completion's
id) from the shard worker's forwarded log (`batchinfer_local.function.ShardWorkerFunction`), so a
test can compare what the model answered with what output.jsonl holds. The shard worker must run
with `POWERTOOLS_LOG_LEVEL=DEBUG`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

WORKER_LOG = "batchinfer_local.function.ShardWorkerFunction"
TERMINAL = {"completed", "failed", "expired", "cancelled"}


class AnswerLog(logging.Handler):
    """Completion ids the embedded model answered while installed (a context manager)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.ids: list[str] = []
        self._lock2 = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if "llama.cpp answered" not in line:
            return
        with self._lock2:
            self.ids.append(json.loads(line)["completion_id"])

    def __enter__(self) -> AnswerLog:
        logger = logging.getLogger(WORKER_LOG)
        self._level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger(WORKER_LOG)
        logger.removeHandler(self)
        logger.setLevel(self._level)


def output_completion_ids(lines: list[dict[str, Any]]) -> list[str]:
    """The completion ids of output.jsonl lines (`response.body.id`)."""
    return [line["response"]["body"]["id"] for line in lines]


def watch(
    get: Callable[[], dict[str, Any]],
    *,
    until: Callable[[dict[str, Any]], bool] = lambda batch: batch["status"] in TERMINAL,
    poll_s: float = 0.2,
    timeout_s: float = 300.0,
    on_poll: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """GET the batch (`get()`) every `poll_s` until `until(batch)`; every snapshot, the last included.
    `on_poll` sees each snapshot (e.g. to cancel once some requests answered)."""
    series, deadline = [], time.monotonic() + timeout_s
    while True:
        batch = get()
        series.append(batch)
        if on_poll is not None:
            on_poll(batch)
        if until(batch):
            return series
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch['id']} still {batch['status']} after {timeout_s} s")
        time.sleep(poll_s)


def assert_counts_monotonic(series: list[dict[str, Any]]) -> None:
    """`request_counts.completed` and `.failed` and the `usage` tokens never go down from one GET to
    the next, and completed + failed never passes the total."""
    previous = None
    for batch in series:
        counts, usage = batch["request_counts"], batch["usage"]
        now = (counts["completed"], counts["failed"], usage["input_tokens"], usage["output_tokens"])
        assert counts["completed"] + counts["failed"] <= counts["total"] or counts["total"] == 0, counts
        if previous is not None:
            assert all(a <= b for a, b in zip(previous, now, strict=True)), (previous, now, batch["status"])
        previous = now
