"""SQS messages between the stages; bodies are small JSON documents validated with pydantic."""

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


def send(queue_url: str, messages: Iterable[BaseModel], *, delay_seconds: int = 0) -> None:
    """Send messages, 10 per `SendMessageBatch` call, each received no sooner than `delay_seconds`
    (0 to 900, SQS's `DelaySeconds`); raises RuntimeError naming any that failed."""
    batch: list[BaseModel] = []
    for message in messages:
        batch.append(message)
        if len(batch) == 10:
            _send_batch(queue_url, batch, delay_seconds)
            batch = []
    if batch:
        _send_batch(queue_url, batch, delay_seconds)


def _send_batch(queue_url: str, batch: list[BaseModel], delay_seconds: int) -> None:
    entries = [
        {
            "Id": str(i),
            "MessageBody": m.model_dump_json(),
            **({"DelaySeconds": delay_seconds} if delay_seconds else {}),
        }
        for i, m in enumerate(batch)
    ]
    failed = client("sqs").send_message_batch(QueueUrl=queue_url, Entries=entries).get("Failed", [])
    if failed:
        raise RuntimeError(f"SQS refused {len(failed)} message(s): {failed[0].get('Message')}")
