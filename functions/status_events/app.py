"""Status events function: the batch table's stream -> EventBridge events and webhook deliveries."""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core.observability import logger, metrics, tracer
from batchinfer.pipeline.events import images, is_batch_header, publish, status_change

# Partial failures by sequence number: Lambda resumes the shard from the first failed record.
processor = BatchProcessor(event_type=EventType.DynamoDBStreams)


def record_handler(record: DynamoDBRecord) -> str:
    stream = record.dynamodb
    if stream is None or not is_batch_header(stream.keys or {}):
        return "skipped"  # the event source's filter lets only batch headers through; this is a guard
    change = status_change(images(stream.old_image), images(stream.new_image))
    if change is None:
        return "unchanged"
    publish(change)
    logger.info(
        "status event",
        extra={"batch_id": change.header.id, "status": change.header.status, "before": change.before},
    )
    return change.header.status.value


@metrics.log_metrics
@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
