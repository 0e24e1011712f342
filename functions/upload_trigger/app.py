"""Upload-trigger function: S3 notifications of `inbox/**.jsonl` (via SQS UploadsQueue) start batches."""

import json

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.s3_event import S3Event
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core.observability import logger, metrics, tracer
from batchinfer.pipeline.inbox import start_from_record

processor = BatchProcessor(event_type=EventType.SQS)


def record_handler(record: SQSRecord) -> list[str]:
    message = json.loads(record.body)
    if message.get("Event") == "s3:TestEvent":  # sent once when the notification is configured
        return []
    started = [
        batch_id
        for s3_record in S3Event(message).records
        if (batch_id := start_from_record(s3_record)) is not None
    ]
    logger.info("uploads", extra={"batch_ids": started})
    return started


@metrics.log_metrics
@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
