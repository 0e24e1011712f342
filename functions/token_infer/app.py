"""Token-infer function: the KServe v2 `/v2` routes (token inference on the embedded model), HTTP API."""

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core.observability import logger, metrics, tracer
from batchinfer.infer.app import app


# log_event=False whatever POWERTOOLS_LOGGER_LOG_EVENT says: the event holds the caller's API key
# (the Authorization header), which must never reach a log.
@metrics.log_metrics
@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP, log_event=False)
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    return app.resolve(event, context)
