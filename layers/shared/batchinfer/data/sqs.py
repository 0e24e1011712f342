"""SQS messages between the stages; bodies are small JSON documents validated with pydantic.

Every message about a batch is sent with the batch's account id as its `MessageGroupId`. On a standard
queue that makes the queue a fair queue (AWS, 2025): a tenant (message group) with a backlog does not
hold back the others; SQS delivers the messages of the quiet tenants first, so their dwell time stays
low, while the queue keeps standard semantics (no ordering, no deduplication, groups processed in
parallel). Sources: https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-fair-queues.html
and, for standard vs FIFO queues,
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/using-messagegroupid-property.html.
The queues stay standard: no `MessageDeduplicationId` is sent. The local stack delivers the same way
(`batchinfer_local.moto_compat.deliver_fairly`).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from batchinfer.core.aws import client


class BatchMessage(BaseModel):
    """Body of a prepare or finalize message: `{"batch_id": ...}`."""

    batch_id: str


class ShardMessage(BaseModel):
    """Body of a shard message: run shard `shard` of `batch_id` from its recorded `next_index`."""

    batch_id: str
    shard: int


def send(queue_url: str, messages: Iterable[BaseModel], *, group_id: str, delay_seconds: int = 0) -> None:
    """Send messages, 10 per `SendMessageBatch` call, all with `MessageGroupId` `group_id` (the account
    id of the batch they are about: the fair queue's tenant, see the module docstring), each received
    no sooner than `delay_seconds` (0 to 900, SQS's `DelaySeconds`); raises RuntimeError naming any
    that failed."""
    batch: list[BaseModel] = []
    for message in messages:
        batch.append(message)
        if len(batch) == 10:
            _send_batch(queue_url, batch, group_id, delay_seconds)
            batch = []
    if batch:
        _send_batch(queue_url, batch, group_id, delay_seconds)


def _send_batch(queue_url: str, batch: list[BaseModel], group_id: str, delay_seconds: int) -> None:
    entries = [
        {
            "Id": str(i),
            "MessageBody": m.model_dump_json(),
            "MessageGroupId": group_id,
            **({"DelaySeconds": delay_seconds} if delay_seconds else {}),
        }
        for i, m in enumerate(batch)
    ]
    failed = client("sqs").send_message_batch(QueueUrl=queue_url, Entries=entries).get("Failed", [])
    if failed:
        raise RuntimeError(f"SQS refused {len(failed)} message(s): {failed[0].get('Message')}")
