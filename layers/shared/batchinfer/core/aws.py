"""boto3 clients, created lazily once per process and per endpoint.

Clients are created on first use, not at import, so the local stack (and tests) can point
`AWS_ENDPOINT_URL` at a moto server before any handler runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from typing import Any

import boto3
from botocore.config import Config

from batchinfer.core import chaos
from batchinfer.core.settings import get_settings

_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=64)

CallHook = Callable[[str, str], None]
_CALL_HOOKS: list[CallHook] = []


def on_call(hook: CallHook) -> Callable[[], None]:
    """Call `hook(service, operation)` (e.g. `("s3", "PutObject")`) before every AWS API call made
    through this module's clients, retries included, from any thread. Returns the function that
    removes the hook. For measurements (`make bench` counts the calls per request): without
    hooks a call costs one empty loop more."""
    _CALL_HOOKS.append(hook)
    return lambda: _CALL_HOOKS.remove(hook)


def _before_call(model: Any, **_: Any) -> None:
    for hook in list(_CALL_HOOKS):
        hook(model.service_model.service_name, model.name)


@cache
def _session(endpoint: str | None) -> boto3.session.Session:
    session = boto3.session.Session()
    # On the session, before any client exists: each client copies the session's handlers.
    session.events.register("before-call", _before_call)
    # First: in-process moto answers `before-send` too (tests), and an injected fault must come first.
    session.events.register_first("before-send", chaos.aws_fault)
    return session


@cache
def _client(service: str, endpoint: str | None) -> Any:
    return _session(endpoint).client(service, config=_CONFIG)


@cache
def _table(name: str, endpoint: str | None) -> Any:
    return _session(endpoint).resource("dynamodb", config=_CONFIG).Table(name)


def client(service: str) -> Any:
    """A cached boto3 client for `service` ("s3", "sqs", ...)."""
    return _client(service, os.environ.get("AWS_ENDPOINT_URL"))


def table() -> Any:
    """The batch table (boto3 resource `Table`; its `meta.client` accepts plain Python values)."""
    return _table(get_settings().table_name, os.environ.get("AWS_ENDPOINT_URL"))
