"""A `Schedule` event source (an EventBridge rule): `SchedulePoller` and the event it sends.

Rules of https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-run-lambda-schedule.html: an
asynchronous invocation per tick, whether or not the previous one has ended.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

from ..functions import ScheduleEventSpec
from ..runtime import InvocationError, Invoker, Throttled
from .poller import Poller

log = logging.getLogger(__name__)


def scheduled_event(rule_arn: str, account: str, region: str) -> dict[str, Any]:
    """An EventBridge "Scheduled Event", as a schedule rule sends it to Lambda."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [rule_arn],
        "detail": {},
    }


class SchedulePoller(Poller):
    """Invokes a function asynchronously every `interval` seconds (first call one interval after start).

    The event is the declared `Input` JSON if any, else a Scheduled Event. Each tick is an invocation of
    its own, whether or not the previous one has ended; a tick the function has no free environment for
    is dropped (Lambda would retry the throttled event later; the next tick comes first here). Errors
    are logged (EventBridge's asynchronous retries are not emulated).
    """

    def __init__(
        self,
        function: Invoker,
        source: ScheduleEventSpec,
        interval: float,
        stack_name: str,
        account: str,
        region: str,
        stopping: threading.Event,
    ) -> None:
        super().__init__("schedule", function, source, stopping)
        self.source, self.interval = source, interval
        self._rule_arn = (
            f"arn:aws:events:{region}:{account}:rule/{stack_name}-{function.spec.logical_id}{source.name}"
        )
        self._account, self._region = account, region

    def run(self) -> None:
        """Tick until the stack stops."""
        while not self._stopping.wait(self.interval):
            event = (
                json.loads(self.source.input)
                if self.source.input is not None
                else scheduled_event(self._rule_arn, self._account, self._region)
            )
            self._spawn(self._invoke, event, "tick")

    def _invoke(self, event: dict[str, Any]) -> None:
        try:
            self.function.invoke(event, block=False)
        except Throttled:
            log.info("%s: throttled, this tick is dropped", self.name)
        except InvocationError as error:
            if not self._stopping.is_set():
                log.warning("%s: scheduled invocation failed: %s", self.name, error)
