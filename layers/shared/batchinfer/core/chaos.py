"""Fault injection for the local stack's chaos mode; inert unless `BATCHINFER_CHAOS` is set.

`BATCHINFER_CHAOS` is a JSON object of fault rates in [0, 1] and a seed, e.g.
`{"seed": 7, "crash_before_commit": 0.05, "crash_after_commit": 0.05, "backend_error": 0.05,
"slow_backend": 0.05, "duplicate_delivery": 0.05}`. Crashes raise `ChaosCrash` at named points of
the pipeline (the handler then fails like a crashed Lambda: SQS redelivers); backend faults are
injected by `batchinfer.backends.chaos.ChaosBackend`; duplicate delivery is done by the local stack's SQS
pollers; `aws_error` answers an AWS API call (any attempt, retries included) with the throttling or
5xx error that service sends under load (`aws_fault`), before the request is sent: botocore's
retries then see what they see on AWS.
"""

from __future__ import annotations

import io
import json
import os
import random
import threading
from collections import Counter
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from botocore.awsrequest import AWSResponse
from pydantic import BaseModel, ConfigDict, Field


class ChaosConfig(BaseModel):
    """Fault rates (probability per opportunity) and the seed of their random choices.

    `per_environment` (default true): each execution environment draws its own faults from the seed;
    false: every environment draws the seed's one sequence, so a seed whose first draws fire makes
    each fault fire at its first chance in whichever environment meets it (tests/e2e/test_fault_suite.py
    relies on it), at the price of correlated faults across a function's environments."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    crash_before_commit: float = Field(0.0, ge=0, le=1)
    crash_after_commit: float = Field(0.0, ge=0, le=1)
    crash_in_aggregator: float = Field(0.0, ge=0, le=1)
    backend_error: float = Field(0.0, ge=0, le=1)
    slow_backend: float = Field(0.0, ge=0, le=1)
    slow_backend_seconds: float = Field(0.5, ge=0)
    duplicate_delivery: float = Field(0.0, ge=0, le=1)
    aws_error: float = Field(0.0, ge=0, le=1)
    per_environment: bool = True


class ChaosCrash(RuntimeError):
    """An injected crash: the invocation ends here, as if the Lambda had died."""


_lock = threading.Lock()
# How many times each fault fired since the last `reset()` (tests check the faults happened).
injected: Counter[str] = Counter()


@lru_cache(maxsize=1)
def state() -> tuple[ChaosConfig, dict[str, random.Random]] | None:
    """The parsed `BATCHINFER_CHAOS` config and one random stream per fault, or None when chaos is off.

    One stream per fault: a fault's draws don't depend on how other faults' draws interleave. And,
    unless `per_environment` is false, one per execution environment (its `AWS_LAMBDA_LOG_STREAM_NAME`,
    unique to it; none outside Lambda or the local stack): with the seed alone every environment of a
    function drew the same faults in the same order, so at its k-th commit each of 20 shard workers
    crashed, or none did (seen in `benchmarks.backlog`: `crash_before_commit` at 2% fired 0 times in
    about 800 commits)."""
    raw = os.environ.get("BATCHINFER_CHAOS")
    if not raw:
        return None
    config = ChaosConfig.model_validate(json.loads(raw))
    environment = os.environ.get("AWS_LAMBDA_LOG_STREAM_NAME") if config.per_environment else None
    base = f"{config.seed}/{environment}" if environment else str(config.seed)
    return config, {name: random.Random(f"{base}/{name}") for name in ChaosConfig.model_fields}


def reset() -> None:
    """Forget the cached config and the fault counts (tests change `BATCHINFER_CHAOS` between runs)."""
    state.cache_clear()
    injected.clear()


def roll(fault: str) -> bool:
    """True with the configured probability of `fault` (always False when chaos is off)."""
    current = state()
    if current is None:
        return False
    config, streams = current
    with _lock:
        fired = streams[fault].random() < getattr(config, fault)
        if fired:
            injected[fault] += 1
        return fired


def crash_point(fault: str) -> None:
    """Raise `ChaosCrash` here with the probability of `fault`."""
    if roll(fault):
        raise ChaosCrash(fault)


# What each service answers when it sheds load: (HTTP status, headers, body) in its own protocol.
# DynamoDB: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/Programming.Errors.html
# S3: https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html (503 SlowDown)
# SQS and EventBridge (JSON protocol): a 500 InternalFailure.
_DYNAMODB_THROTTLE = (
    b'{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",'
    b'"message":"chaos: throughput exceeded"}'
)
_AWS_FAULTS: dict[str, tuple[int, dict[str, str], bytes]] = {
    "dynamodb": (400, {"Content-Type": "application/x-amz-json-1.0"}, _DYNAMODB_THROTTLE),
    "s3": (
        503,
        {"Content-Type": "application/xml"},
        b'<?xml version="1.0" encoding="UTF-8"?>'
        b"<Error><Code>SlowDown</Code><Message>chaos: please reduce your request rate</Message></Error>",
    ),
}
_OTHER_FAULT = (
    500,
    {"Content-Type": "application/x-amz-json-1.0"},
    b'{"__type":"InternalFailure","message":"chaos: internal failure"}',
)


class _Raw(io.BytesIO):
    """The body of an injected answer, read as botocore reads a urllib3 response."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.getvalue()


def aws_fault(request: Any, event_name: str = "", **_: Any) -> AWSResponse | None:
    """botocore `before-send` handler: with the probability of `aws_error`, an injected answer (the
    request is not sent) for the call named by `event_name` ("before-send.s3.PutObject"); None
    otherwise, and always when chaos is off. Registered on every client of `batchinfer.core.aws`."""
    if not roll("aws_error"):
        return None
    service = event_name.split(".")[1] if event_name.count(".") >= 2 else ""
    status, headers, body = _AWS_FAULTS.get(service, _OTHER_FAULT)
    # A HEAD answer has no body: the caller sees only the status (as S3's "503" for a HEAD).
    return AWSResponse(request.url, status, headers, _Raw(b"" if request.method == "HEAD" else body))
