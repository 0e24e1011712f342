"""Sweeper function (schedule): expire overdue batches, re-send messages that were lost, delete
result files past their `output_expires_after` (`pipeline.retention`), and give back the storage
reserved by uploads that expired pending (`data.uploads.release_expired`)."""

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core.observability import logger, metrics, tracer
from batchinfer.data.uploads import release_expired
from batchinfer.pipeline.retention import expire_files
from batchinfer.pipeline.sweep import sweep


@metrics.log_metrics
@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    actions = sweep()
    actions["files_expired"] = expire_files()
    actions["uploads_expired"] = release_expired()
    logger.info("swept", extra=actions)
    redrives = actions["prepare"] + actions["shards"] + actions["finalize"]
    metrics.add_metric(name="Redrives", unit=MetricUnit.Count, value=redrives)
    metrics.add_metric(name="BatchesPastWindow", unit=MetricUnit.Count, value=actions["past_window"])
    return actions
