"""batchinfer's local stack: the pipeline of template.yaml on one machine, no cloud account, no Docker.

moto (in server mode) stands in for DynamoDB, S3 and SQS; the functions' handlers run in this
process, driven from their declared events (SQS pollers, schedules, an HTTP API bridge).
"""

from .stack import DEFAULT_TEMPLATE, LocalStack
from .template import TemplateError

__all__ = ["DEFAULT_TEMPLATE", "LocalStack", "TemplateError"]
