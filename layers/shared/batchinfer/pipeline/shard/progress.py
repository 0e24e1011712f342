"""While a window runs: the shard worker's live link to its batch (`ProgressLink`), and how a batch
that is cancelled or expires meanwhile ends its shards (`Ending`, `ending_of`)."""

from __future__ import annotations

from dataclasses import dataclass

from batchinfer.data import batches
from batchinfer.data.items import BatchHeader, LiveProgress
from batchinfer.data.table import now
from batchinfer.pipeline.shard.requests import COUNTS, Outcome, Request
from batchinfer.wire.status import BatchStatus

# A `live` entry not published again for this long (seconds) is a worker that ended or crashed: its
# window is not one of the running workers' (`ProgressLink.windows`).
STALE_SECONDS = 5


@dataclass(frozen=True, slots=True)
class Ending:
    """How a batch that stops early (cancelled, or expired) ends, and what its error lines say:
    `code` / `message` for requests that never reached the model, `cut_code` / `cut_message` for
    requests that were at the model when the grace after the cancel (or expiry) ran out, whose
    answers were not kept."""

    status: BatchStatus
    code: str
    message: str
    cut_code: str
    cut_message: str

    def never_ran(self, request: Request) -> Outcome:
        """The outcome of `request` that never reached the model."""
        return Outcome(request, None, None, None, {"code": self.code, "message": self.message})

    def cut(self, request: Request) -> Outcome:
        """The outcome of `request` that was stopped at the model after the grace."""
        return Outcome(request, None, None, None, {"code": self.cut_code, "message": self.cut_message})


ENDINGS = {
    BatchStatus.CANCELLED: Ending(
        BatchStatus.CANCELLED,
        "batch_cancelled",
        "The batch was cancelled before this request ran.",
        "batch_cancelled_in_flight",
        "The batch was cancelled while this request was running at the model; it did not finish within "
        "the cancel grace (CANCEL_GRACE_SECONDS) and its answer was not kept.",
    ),
    BatchStatus.EXPIRED: Ending(
        BatchStatus.EXPIRED,
        "batch_expired",
        "The batch expired before this request ran.",
        "batch_expired_in_flight",
        "The batch expired while this request was running at the model; it did not finish within "
        "the grace (CANCEL_GRACE_SECONDS) and its answer was not kept.",
    ),
}


def ending_of(header: BatchHeader | None, at: int) -> Ending | None:
    """The ending `header` asks of its shard workers at Unix time `at`, or None (go on): `cancelling`
    (or `cancelled`) -> cancelled; `finalizing` toward `expired`, `expired`, or `in_progress` with
    `expires_at` passed -> expired. A batch that is gone ends as cancelled."""
    if header is None or header.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        return ENDINGS[BatchStatus.CANCELLED]
    if header.status == BatchStatus.EXPIRED or header.final_status == BatchStatus.EXPIRED:
        return ENDINGS[BatchStatus.EXPIRED]
    if header.status == BatchStatus.IN_PROGRESS and at >= header.expires_at:
        return ENDINGS[BatchStatus.EXPIRED]
    return None


def running_windows(live: dict[str, LiveProgress], at: int) -> list[int | None]:
    """The windows of the workers running at Unix time `at` (`live` entries published within
    `STALE_SECONDS`; None: a worker whose limiter is still in startup)."""
    return [p.window for p in live.values() if p.at >= at - STALE_SECONDS]


class ProgressLink:
    """The shard worker's live link to its batch (GET shows progress; a cancel reaches the
    worker): one write per interval.

    `publish(counts)` SETs the header's `live.<shard>` to the absolute counts of the current window's
    finished requests (`batches.publish_progress`) and reads the batch's status in the same write's
    answer: `ending` is set once the batch is cancelled or expired (`ending_of`). What it publishes is
    never below what an earlier holder of the shard had published for the same window (`floor`, from
    the header read when the shard was claimed): a crashed worker's progress that is lost and redone
    does not make GET's counts go down. One `publish` at a time (`WindowRun` awaits each).

    `publish` also carries the worker's limiter window (`window`), and the header's answer tells the
    windows of every worker of the batch running now (`windows`, this one's included): the workers share
    what their limiters found (`backends.limiter.AdaptiveLimiter.share_with`).
    """

    def __init__(
        self,
        batch_id: str,
        shard_no: int,
        start: int,
        published: LiveProgress | None,
        others: dict[str, LiveProgress] | None = None,
    ) -> None:
        """`published`: this shard's `live` entry when claimed; `others`: the header's `live` map then,
        whose running workers' windows (and this one, not yet published) are `windows` until the first
        `publish`: a worker starts at its share of what the others found."""
        self.batch_id, self.shard_no, self.start = batch_id, shard_no, start
        same = published is not None and published.start == start
        self.floor = {name: getattr(published, name) if same else 0 for name in COUNTS}
        self.ending: Ending | None = None
        running = {k: p for k, p in (others or {}).items() if k != str(shard_no)}
        self.windows: list[int | None] = [*running_windows(running, now()), None] if running else []

    def publish(self, counts: dict[str, int], window: int | None = None) -> Ending | None:
        """Publish `counts` (the window's finished requests) and the limiter's `window`; the batch's
        ending, if it is ending. Sets `windows`."""
        at = now()
        progress = LiveProgress(
            start=self.start,
            at=at,
            window=window,
            **{n: max(counts.get(n, 0), self.floor[n]) for n in COUNTS},
        )
        header = batches.publish_progress(self.batch_id, self.shard_no, progress)
        self.ending = self.ending or ending_of(header, at)
        self.windows = running_windows(header.live if header is not None else {}, at)
        return self.ending

    def rest_after(self, counts: dict[str, int], end: int) -> LiveProgress | None:
        """What stays published once `counts` (of requests up to `end`) are committed: the part of the
        floor they do not cover yet (None: nothing), shown until the redo reaches it."""
        rest = {n: max(0, self.floor[n] - counts.get(n, 0)) for n in COUNTS}
        return LiveProgress(start=end, at=now(), **rest) if any(rest.values()) else None

    def committed(self, counts: dict[str, int], end: int) -> None:
        """The commit of `counts` up to `end` went through: the next window starts there."""
        self.floor = {n: max(0, self.floor[n] - counts.get(n, 0)) for n in COUNTS}
        self.start = end
