"""The template's tables, buckets and queues on a moto server process, for benchmarks that run
batchinfer's functions in this process (or in child processes that inherit the environment)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import boto3

from benchmarks.common import moto_server


def _clear_caches() -> None:
    from batchinfer.core import aws
    from batchinfer.core.settings import get_settings

    for cached in (aws._session, aws._client, aws._table, get_settings):
        cached.cache_clear()


@contextmanager
def moto_environment(extra: Mapping[str, str] | None = None) -> Iterator[str]:
    """Start moto, create the template's resources there, set the functions' environment (plus
    `extra`) in `os.environ`; yield moto's URL. The environment is restored afterwards."""
    from batchinfer_local.functions import function_specs, merged_environment
    from batchinfer_local.resources import create_resources
    from batchinfer_local.stack import DEFAULT_TEMPLATE
    from batchinfer_local.template import Resolver, load_template

    saved = dict(os.environ)
    with moto_server() as endpoint:
        try:
            for key in [k for k in os.environ if k.startswith("AWS_")]:
                del os.environ[key]
            os.environ.update(
                {
                    "AWS_ENDPOINT_URL": endpoint,
                    "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1",
                    "POWERTOOLS_LOG_LEVEL": "WARNING",
                }
            )
            template = load_template(DEFAULT_TEMPLATE)
            resolver = Resolver(template, {})
            for logical_id, resource in template["Resources"].items():
                if resource.get("Type") == "AWS::Serverless::HttpApi":
                    resolver.add_resource(logical_id, logical_id)
            create_resources(template, resolver, {n: boto3.client(n) for n in ("sqs", "dynamodb", "s3")})
            os.environ.update(merged_environment(function_specs(template, DEFAULT_TEMPLATE.parent, resolver)))
            os.environ.update(extra or {})
            _clear_caches()
            yield endpoint
        finally:
            os.environ.clear()
            os.environ.update(saved)
            _clear_caches()
