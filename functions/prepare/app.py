"""Prepare function: validate and shard a batch's input (SQS PrepareQueue, one message per batch)."""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
from aws_lambda_powertools.utilities.parser.types import Json
from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core.observability import logger, metrics, tracer
from batchinfer.data.sqs import BatchMessage
from batchinfer.pipeline.prepare import prepare_batch


class PrepareRecord(SqsRecordModel):
    body: Json[BatchMessage]  # type: ignore[assignment]


processor = BatchProcessor(event_type=EventType.SQS, model=PrepareRecord)


def record_handler(record: PrepareRecord) -> str:
    outcome = prepare_batch(record.body.batch_id)
    logger.info("prepared", extra={"batch_id": record.body.batch_id, "outcome": outcome})
    return outcome


@metrics.log_metrics
@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
