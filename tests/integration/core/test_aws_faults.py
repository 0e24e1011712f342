"""Chaos mode's AWS-side faults (`chaos.aws_fault`) on the clients of `batchinfer.core.aws`,
against moto: each service answers as it does when it sheds load, and botocore's retries see it."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from botocore import endpoint
from botocore.exceptions import ClientError

from batchinfer.core import aws, chaos
from support.moto_env import Aws

SEED = 3


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits botocore's retries asked for (seconds), not slept: the test does not wait them out."""
    waits: list[float] = []
    monkeypatch.setattr(endpoint.time, "sleep", waits.append)
    return waits


@pytest.fixture
def faults(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, backoffs: list[float]) -> Iterator[Any]:
    """`faults(rate)`: chaos on with `aws_error` at `rate`; off again after the test."""

    def arm(rate: float) -> None:
        monkeypatch.setenv("BATCHINFER_CHAOS", json.dumps({"seed": SEED, "aws_error": rate}))
        chaos.reset()

    yield arm
    monkeypatch.delenv("BATCHINFER_CHAOS", raising=False)
    chaos.reset()


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda bucket: aws.client("s3").head_bucket(Bucket=bucket), "503"),  # HEAD: no body, the status
        (lambda bucket: aws.client("s3").get_object(Bucket=bucket, Key="k"), "SlowDown"),
        (
            lambda bucket: aws.table().get_item(Key={"PK": "a", "SK": "b"}),
            "ProvisionedThroughputExceededException",
        ),
        (lambda bucket: aws.client("sqs").list_queues(), "InternalFailure"),
    ],
    ids=["s3-head", "s3", "dynamodb", "sqs"],
)
def test_every_attempt_failing_surfaces_the_services_own_error_after_the_retries(
    moto_aws: Aws, faults: Any, backoffs: list[float], call: Any, code: str
) -> None:
    faults(1.0)
    with pytest.raises(ClientError) as raised:
        call(moto_aws.bucket)
    assert raised.value.response["Error"]["Code"] == code
    # botocore's standard retry mode retried (max_attempts 5 in core.aws: five retries), each a fault
    assert raised.value.response["ResponseMetadata"]["RetryAttempts"] == 5
    assert chaos.injected["aws_error"] == 6
    assert len(backoffs) == 5 and all(0 <= wait <= 20 for wait in backoffs)  # standard mode's jittered waits


def test_faults_at_a_rate_are_retried_away_and_each_fault_is_one_attempt(
    moto_aws: Aws, faults: Any, backoffs: list[float]
) -> None:
    # Given a fault on a quarter of the attempts
    faults(0.25)
    s3 = aws.client("s3")

    # When 30 objects are written and read back
    for n in range(30):
        s3.put_object(Bucket=moto_aws.bucket, Key=f"k{n}", Body=f"v{n}".encode())
    read = [s3.get_object(Bucket=moto_aws.bucket, Key=f"k{n}")["Body"].read() for n in range(30)]

    # Then every call succeeded after its retries, and the faults are the seeded draws that failed
    assert read == [f"v{n}".encode() for n in range(30)]
    draws = random.Random(f"{SEED}/aws_error")
    expected = 0
    for _ in range(60):  # each call: draws until one passes
        while draws.random() < 0.25:
            expected += 1
    assert chaos.injected["aws_error"] == expected == len(backoffs)
