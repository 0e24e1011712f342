"""Webhook function: deliver signed batch webhooks (SQS WebhookQueue), retried with backoff."""

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
from aws_lambda_powertools.utilities.parser.types import Json
from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core.aws import client
from batchinfer.core.observability import logger, metrics, tracer
from batchinfer.core.settings import get_settings
from batchinfer.pipeline.events import WebhookMessage
from batchinfer.pipeline.webhooks import DeliveryFailed, backoff_seconds, deliver


class WebhookRecord(SqsRecordModel):
    body: Json[WebhookMessage]  # type: ignore[assignment]


processor = BatchProcessor(event_type=EventType.SQS, model=WebhookRecord)


def record_handler(record: WebhookRecord) -> str:
    message = record.body
    try:
        outcome = deliver(**message.model_dump())
    except DeliveryFailed as error:
        tries = int(record.attributes.ApproximateReceiveCount)
        metrics.add_metric(name="WebhookFailures", unit=MetricUnit.Count, value=1)
        logger.warning(
            "webhook failed", extra={"batch_id": message.batch_id, "tries": tries, "error": str(error)}
        )
        # Backoff: the message comes back later each time (SQS moves it to the DLQ after 5 tries).
        client("sqs").change_message_visibility(
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
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
