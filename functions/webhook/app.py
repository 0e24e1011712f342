"""Webhook function: deliver signed batch webhooks (SQS WebhookQueue) at once, each account capped, before
the invocation's deadline; a failure is retried with backoff, a record left untried comes back as it is."""

import asyncio
import time
from functools import partial

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import (
    AsyncBatchProcessor,
    EventType,
    async_process_partial_response,
)
from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
from aws_lambda_powertools.utilities.parser.types import Json
from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core.aws import client
from batchinfer.core.observability import logger, metrics, tracer
from batchinfer.core.settings import get_settings
from batchinfer.pipeline.events import WebhookMessage
from batchinfer.pipeline.webhooks import Deliveries, DeliveryFailed, Untried, backoff_seconds, deliver

# Seconds kept free at the end of an invocation: the answer (its item failures) must reach Lambda.
RESERVE_SECONDS = 1.0


class WebhookRecord(SqsRecordModel):
    body: Json[WebhookMessage]  # type: ignore[assignment]


processor = AsyncBatchProcessor(event_type=EventType.SQS, model=WebhookRecord)


async def record_handler(record: WebhookRecord, deliveries: Deliveries) -> str:
    message = record.body
    try:
        outcome = await deliver(deliveries, **message.model_dump())
    except Untried:
        logger.info("webhook untried", extra={"batch_id": message.batch_id, "type": message.type})
        raise
    except DeliveryFailed as error:
        tries = int(record.attributes.ApproximateReceiveCount)
        metrics.add_metric(name="WebhookFailures", unit=MetricUnit.Count, value=1)
        logger.warning(
            "webhook failed", extra={"batch_id": message.batch_id, "tries": tries, "error": str(error)}
        )
        # Backoff: the message comes back later each time (SQS moves it to the DLQ after 5 tries).
        await asyncio.to_thread(
            client("sqs").change_message_visibility,
            QueueUrl=get_settings().webhook_queue_url,
            ReceiptHandle=record.receiptHandle,
            VisibilityTimeout=backoff_seconds(tries),
        )
        raise
    if outcome == "delivered":
        metrics.add_metric(name="WebhooksDelivered", unit=MetricUnit.Count, value=1)
    logger.info("webhook", extra={"batch_id": message.batch_id, "type": message.type, "outcome": outcome})
    return outcome


@metrics.log_metrics
@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    deadline = time.monotonic() + context.get_remaining_time_in_millis() / 1000 - RESERVE_SECONDS
    return async_process_partial_response(
        event=event,
        record_handler=partial(record_handler, deliveries=Deliveries.until(deadline)),
        processor=processor,
        context=context,
    )
