"""Shard-worker function: run one shard of a batch on the model backend (SQS ShardsQueue)."""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
from aws_lambda_powertools.utilities.parser.types import Json
from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core.observability import logger, metrics, tracer
from batchinfer.data.sqs import ShardMessage
from batchinfer.pipeline.shard.worker import process_shard


class ShardRecord(SqsRecordModel):
    body: Json[ShardMessage]  # type: ignore[assignment]


processor = BatchProcessor(event_type=EventType.SQS, model=ShardRecord)


def record_handler(record: ShardRecord, lambda_context: LambdaContext) -> str:
    # Powertools passes `lambda_context` to a record handler that asks for it.
    outcome = process_shard(
        record.body,
        owner=f"{lambda_context.aws_request_id}/{record.messageId}",
        time_left_ms=lambda_context.get_remaining_time_in_millis,
    )
    logger.info(
        "shard", extra={"batch_id": record.body.batch_id, "shard": record.body.shard, "outcome": outcome}
    )
    return outcome


@metrics.log_metrics
@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
