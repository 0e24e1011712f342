"""Powertools observability singletons, created once and imported everywhere.

The service name comes from POWERTOOLS_SERVICE_NAME (template.yaml Globals), else `batchinfer`; the
metrics namespace from POWERTOOLS_METRICS_NAMESPACE, else `batchinfer`. Metrics are CloudWatch EMF
lines on stdout, flushed by each handler's `@metrics.log_metrics`; every metric carries the
`service` dimension (template.yaml's alarms and dashboard name it).
"""

import warnings

from aws_lambda_powertools import Logger, Metrics, Tracer

# Most invocations (an API GET, a sweep of nothing) have no metric to add: Powertools warns about each
# such flush, which would be a log line of every such invocation, not news.
warnings.filterwarnings("ignore", message="No application metrics to publish")

logger = Logger(service="batchinfer")
tracer = Tracer(service="batchinfer")
metrics = Metrics(namespace="batchinfer", service="batchinfer")
