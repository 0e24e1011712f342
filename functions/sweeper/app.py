"""Sweeper function (schedule): expire overdue batches and re-send messages that were lost."""

from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core.observability import logger, tracer
from batchinfer.pipeline.sweep import sweep


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    actions = sweep()
    logger.info("swept", extra=actions)
    return actions
