"""Move messages from a dead-letter queue back to the queue that feeds the function.

On AWS, `aws sqs start-message-move-task --source-arn <DLQ ARN>` does the same natively; this one
also works against the local stack (moto has no message move tasks). Every stage is idempotent,
so re-driven messages are safe to run again.
"""

from __future__ import annotations

from typing import Any


def redrive(sqs: Any, dlq_url: str, target_url: str, *, limit: int | None = None) -> int:
    """Move up to `limit` (default: all) messages from `dlq_url` to `target_url`; returns how many.

    Each message is sent (body, message attributes and `MessageGroupId`, the fair queue's tenant,
    kept) before it is deleted from the DLQ, so a
    failure halfway leaves a message in both queues, never in neither.
    """
    moved = 0
    while limit is None or moved < limit:
        wanted = 10 if limit is None else min(10, limit - moved)
        batch = sqs.receive_message(
            QueueUrl=dlq_url,
            MaxNumberOfMessages=wanted,
            WaitTimeSeconds=0,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["MessageGroupId"],
        ).get("Messages", [])
        if not batch:
            break
        entries = [
            {
                "Id": str(i),
                "MessageBody": m["Body"],
                **({"MessageAttributes": m["MessageAttributes"]} if m.get("MessageAttributes") else {}),
                **(
                    {"MessageGroupId": group}
                    if (group := m.get("Attributes", {}).get("MessageGroupId"))
                    else {}
                ),
            }
            for i, m in enumerate(batch)
        ]
        failed = sqs.send_message_batch(QueueUrl=target_url, Entries=entries).get("Failed", [])
        if failed:
            raise RuntimeError(f"could not re-drive {len(failed)} message(s): {failed[0].get('Message')}")
        sqs.delete_message_batch(
            QueueUrl=dlq_url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)],
        )
        moved += len(batch)
    return moved
