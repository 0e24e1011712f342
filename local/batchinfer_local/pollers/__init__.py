"""The event source mappings, one module each (as LocalStack's `event_source_mapping/pollers`): a
`Poller` thread per function and declared source that reads the source and invokes the function.

- `sqs`: SQS queues (S3 notifications arrive through theirs), `SqsPoller`;
- `schedule`: EventBridge schedules, `SchedulePoller`;
- `dynamodb`: DynamoDB streams, `StreamPoller`.
"""

from __future__ import annotations

from .dynamodb import StreamPoller
from .poller import Poller
from .schedule import SchedulePoller
from .sqs import SqsPoller

__all__ = ["Poller", "SchedulePoller", "SqsPoller", "StreamPoller"]
