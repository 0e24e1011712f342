"""Powertools observability singletons, created once and imported everywhere.

The service name comes from POWERTOOLS_SERVICE_NAME (template.yaml Globals), else `batchinfer`.
"""

from aws_lambda_powertools import Logger, Tracer

logger = Logger(service="batchinfer")
tracer = Tracer(service="batchinfer")
