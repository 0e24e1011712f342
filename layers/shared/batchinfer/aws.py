"""boto3 clients, created lazily once per process and per endpoint.

Clients are created on first use, not at import, so the local stack (and tests) can point
`AWS_ENDPOINT_URL` at a moto server before any handler runs.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import boto3
from botocore.config import Config

from batchinfer.settings import get_settings

_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=64)


@lru_cache(maxsize=None)
def _session(endpoint: str | None) -> boto3.session.Session:
    return boto3.session.Session()


@lru_cache(maxsize=None)
def _client(service: str, endpoint: str | None) -> Any:
    return _session(endpoint).client(service, config=_CONFIG)


@lru_cache(maxsize=None)
def _table(name: str, endpoint: str | None) -> Any:
    return _session(endpoint).resource("dynamodb", config=_CONFIG).Table(name)


def client(service: str) -> Any:
    """A cached boto3 client for `service` ("s3", "sqs", ...)."""
    return _client(service, os.environ.get("AWS_ENDPOINT_URL"))


def table() -> Any:
    """The batch table (boto3 resource `Table`; its `meta.client` accepts plain Python values)."""
    return _table(get_settings().table_name, os.environ.get("AWS_ENDPOINT_URL"))
