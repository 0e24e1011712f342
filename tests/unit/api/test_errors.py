"""Which failures are AWS being unavailable (`batchinfer.api.errors.aws_unavailable`: a 503) and which
are bugs (None: a 500), and the OpenAPI document saying so on every route."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from batchinfer.api.app import app
from batchinfer.api.errors import aws_unavailable
from batchinfer.data.table import TransactionConflict


def client_error(code: str, status: int, reasons: list[str] | None = None) -> ClientError:
    response: dict[str, Any] = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    if reasons is not None:
        response["CancellationReasons"] = [{"Code": reason} for reason in reasons]
    return ClientError(response, "Op")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (
            client_error("ProvisionedThroughputExceededException", 400),
            "ProvisionedThroughputExceededException",
        ),
        (client_error("ThrottlingException", 400), "ThrottlingException"),
        (client_error("RequestLimitExceeded", 400), "RequestLimitExceeded"),
        (client_error("InternalServerError", 500), "InternalServerError"),
        (client_error("SlowDown", 503), "SlowDown"),
        (client_error("InternalError", 500), "InternalError"),
        (client_error("ServiceUnavailable", 503), "ServiceUnavailable"),
        (client_error("RequestThrottled", 400), "RequestThrottled"),  # SQS
        (client_error("RequestTimeout", 400), "RequestTimeout"),  # S3: a transient code with a 400
        (client_error("", 504), "504"),  # a HEAD answer has no body, only its status
        (
            client_error("TransactionCanceledException", 400, ["None", "TransactionConflict"]),
            "TransactionCanceledException",
        ),
        (
            client_error("TransactionCanceledException", 400, ["ThrottlingError", "None"]),
            "TransactionCanceledException",
        ),
        (TransactionConflict("cancelled by a concurrent one"), "TransactionConflict"),
        (EndpointConnectionError(endpoint_url="https://s3.amazonaws.com"), "EndpointConnectionError"),
        (ConnectTimeoutError(endpoint_url="https://s3.amazonaws.com"), "ConnectTimeoutError"),
        (ReadTimeoutError(endpoint_url="https://s3.amazonaws.com"), "ReadTimeoutError"),
    ],
)
def test_load_shedding_and_no_answer_are_unavailable(error: Exception, code: str) -> None:
    assert aws_unavailable(error) == code


@pytest.mark.parametrize(
    "error",
    [
        KeyError("status"),
        ValueError("bad"),
        client_error("AccessDeniedException", 400),
        client_error("ValidationException", 400),
        client_error("ConditionalCheckFailedException", 400),
        client_error("NoSuchKey", 404),
        client_error("TransactionCanceledException", 400, ["ConditionalCheckFailed", "TransactionConflict"]),
        client_error("TransactionCanceledException", 400, ["None", "ValidationError"]),
        NoCredentialsError(),
    ],
)
def test_everything_else_is_a_bug(error: Exception) -> None:
    assert aws_unavailable(error) is None


def test_every_route_documents_the_503_with_its_retry_after() -> None:
    document = json.loads(app.get_openapi_json_schema(title="t", version="v"))
    operations = [
        (path, method, op) for path, item in document["paths"].items() for method, op in item.items()
    ]
    assert len(operations) >= 10
    for path, method, operation in operations:
        unavailable = operation["responses"].get("503")
        assert unavailable is not None, f"{method} {path}"
        assert unavailable["headers"]["Retry-After"]["schema"] == {"type": "integer"}
