"""Aggregator function: write a batch's output.jsonl / error.jsonl and end it (SQS FinalizeQueue)."""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
from aws_lambda_powertools.utilities.parser.types import Json
from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core.observability import logger, metrics, tracer
from batchinfer.data.sqs import BatchMessage
from batchinfer.pipeline.aggregate import finalize_batch


class FinalizeRecord(SqsRecordModel):
    body: Json[BatchMessage]  # type: ignore[assignment]


processor = BatchProcessor(event_type=EventType.SQS, model=FinalizeRecord)


def record_handler(record: FinalizeRecord) -> str:
    outcome = finalize_batch(record.body.batch_id)
    logger.info("finalized", extra={"batch_id": record.body.batch_id, "outcome": outcome})
    return outcome


@metrics.log_metrics
@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
