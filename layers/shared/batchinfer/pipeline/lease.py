"""The heartbeat of a lease: a shard's (`shards.renew`, the shard worker) or a batch's
prepare lease (`batches.renew_prepare`, prepare). A lease is short; its holder renews it every third
of it while it works, so a live holder keeps it however long it works, and a crashed one's lease
lapses one lease after its last beat.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from batchinfer.core.observability import logger


class LeaseHeartbeat:
    """Calls `renew()` (one conditional write extending the holder's lease to `lease_seconds` from
    now: True when renewed, False when the lease is another's) every third of `lease_seconds` while
    the holder works, from a thread started on entering the context and stopped on leaving it (however
    the holder leaves it: a crash stops the beats, and the lease lapses one lease after the last one).
    A renewal that finds another owner sets `lost` and ends the beats; one that fails otherwise
    (throttling, a 5xx, a timeout) is tried again at the next beat and is not a loss. `log` names the
    lease in the warnings logged (e.g. `batch_id`, `shard`).

    A thread, not a task of an event loop, so the lease is kept between a shard worker's windows too
    (model load, result PUTs, commits) and while prepare's validation holds the CPU. Hand-written: the
    lease is two attributes of the item it guards, written in the same conditions as its state; lock
    libraries for DynamoDB (e.g. `python-dynamodb-lock`) keep a lock item of their own.
    """

    def __init__(self, renew: Callable[[], bool], lease_seconds: int, **log: Any) -> None:
        self.renew, self.lease_seconds, self.log = renew, lease_seconds, log
        self.interval = lease_seconds / 3
        self._renewed_at = time.monotonic()  # the claim
        self._stop, self._lost = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._beat, name="lease", daemon=True)

    def __enter__(self) -> LeaseHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """No more beats (before a write that gives the lease up); waits for one in flight."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def lost(self) -> bool:
        """True once a renewal found that another holder has the lease."""
        return self._lost.is_set()

    def held(self) -> bool:
        """Whether the lease is still this holder's, checked before a write only it may make: True when
        the last renewal is under two beats old (the lease lasts a beat longer at least), else after a
        renewal now succeeds (the holder was paused past its beats). False when it was lost."""
        if self.lost:
            return False
        if time.monotonic() - self._renewed_at < 2 * self.interval:
            return True
        return self._renew()

    def _renew(self) -> bool:
        started = time.monotonic()
        try:
            renewed = self.renew()
        except Exception:  # a throttled or failed write: the next beat tries again
            logger.warning("lease not renewed", exc_info=True, extra=self.log)
            return True
        if renewed:
            self._renewed_at = started
            return True
        self._lost.set()
        logger.warning("lease lost to another holder", extra=self.log)
        return False

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            if not self._renew():
                return
