"""The progress bar of `submit --wait`, `status --watch` and `wait`, with its rates."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from batchinfer_local.cli.common import console
from batchinfer_local.client import BatchClient


class Rates:
    """Requests/s, tokens/s and the ETA of a batch from the Batch objects polled over time.

    Rates are measured from the first poll that saw the batch `in_progress` (its counts then are the
    baseline), so time spent validating does not dilute them. Why not rich's own task speed: it
    knows only one count, and tokens/s needs `usage` too.
    """

    def __init__(self) -> None:
        self.start: tuple[float, int, int] | None = None
        self.last: tuple[float, int, int] | None = None

    @staticmethod
    def done(batch: dict[str, Any]) -> int:
        counts = batch.get("request_counts") or {}
        return int(counts.get("completed") or 0) + int(counts.get("failed") or 0)

    @staticmethod
    def tokens(batch: dict[str, Any]) -> int:
        usage = batch.get("usage") or {}
        return int(usage.get("total_tokens") or 0) or int(usage.get("input_tokens") or 0) + int(
            usage.get("output_tokens") or 0
        )

    @staticmethod
    def cached(batch: dict[str, Any]) -> int:
        """The batch's input tokens taken from a prompt cache (`usage.input_tokens_details`)."""
        details = (batch.get("usage") or {}).get("input_tokens_details") or {}
        return int(details.get("cached_tokens") or 0)

    def update(self, batch: dict[str, Any], now: float) -> dict[str, str]:
        """Fields for the progress line: `rps`, `tps` (one decimal, "-" before any rate) and `eta`
        (m:ss, "-" while unknown)."""
        sample = (now, self.done(batch), self.tokens(batch))
        if self.start is None and batch.get("status") != "validating":
            self.start = sample
        self.last = sample
        if self.start is None or now <= self.start[0] or sample[1] == self.start[1]:
            return {"rps": "-", "tps": "-", "eta": "-"}
        elapsed = now - self.start[0]
        rps = (sample[1] - self.start[1]) / elapsed
        tps = (sample[2] - self.start[2]) / elapsed
        total = int((batch.get("request_counts") or {}).get("total") or 0)
        remaining = max(total - sample[1], 0)
        eta = round(remaining / rps)
        return {"rps": f"{rps:.1f}", "tps": f"{tps:.1f}", "eta": f"{eta // 60}:{eta % 60:02d}"}


def progress_bar(target: Console) -> Progress:
    """The bar of `submit --wait`, `status --watch` and `wait`: status, done of total, failed,
    requests/s, tokens/s, cached input tokens, ETA, elapsed."""
    return Progress(
        TextColumn("{task.fields[status]:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TextColumn("{task.fields[rps]} req/s"),
        TextColumn("{task.fields[tps]} tok/s"),
        TextColumn("cached {task.fields[cached]}"),
        TextColumn("ETA {task.fields[eta]}"),
        TimeElapsedColumn(),
        console=target,
    )


def follow(
    client: BatchClient,
    batch_id: str,
    *,
    show: bool,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Poll the batch until it is terminal, with the progress bar when `show`; the last Batch object."""
    if not show:
        return client.wait(batch_id, poll_s=poll_s)
    rates = Rates()
    with progress_bar(console) as progress:
        task = progress.add_task(
            "batch", total=None, status="validating", failed=0, rps="-", tps="-", cached=0, eta="-"
        )

        def update(batch: dict[str, Any]) -> None:
            counts = batch.get("request_counts") or {}
            progress.update(
                task,
                total=counts.get("total") or None,
                completed=Rates.done(batch),
                status=batch["status"],
                failed=counts.get("failed") or 0,
                cached=Rates.cached(batch),
                **rates.update(batch, clock()),
            )

        return client.wait(batch_id, poll_s=poll_s, on_update=update)
