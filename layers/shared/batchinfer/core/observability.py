"""Powertools observability singletons, created once and imported everywhere.

Service name and metrics namespace come from POWERTOOLS_SERVICE_NAME / POWERTOOLS_METRICS_NAMESPACE.
"""

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger(service="batchinfer")
tracer = Tracer(service="batchinfer")
metrics = Metrics(namespace="batchinfer", service="batchinfer")
