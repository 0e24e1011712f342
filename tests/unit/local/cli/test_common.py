"""One-line API errors: the server's message, the status and what to do."""

from __future__ import annotations

import httpx

from batchinfer_local.cli.common import describe_api_error
from batchinfer_local.client import ApiError


def _error(status: int, body: object) -> ApiError:
    request = httpx.Request("GET", "http://h/v1/batches/b")
    return ApiError.of(httpx.Response(status, json=body, request=request))


def test_api_errors_read_the_envelope_and_end_in_what_to_do() -> None:
    unauthorized = _error(
        401,
        {
            "error": {
                "message": "Incorrect API key provided.",
                "type": "x",
                "param": None,
                "code": "invalid_api_key",
            }
        },
    )
    missing = _error(
        404, {"error": {"message": "No such batch: b", "code": "batch_not_found", "param": "batch_id"}}
    )
    gateway = _error(413, {"message": "Request Entity Too Large"})
    kserve = _error(400, {"error": "inputs[0].shape: must be [1, n]"})
    assert describe_api_error(unauthorized) == (
        "error: Incorrect API key provided. (HTTP 401, invalid_api_key): set BATCHINFER_API_KEY or pass "
        "--api-key (`batchinfer local` prints the local stack's key)"
    )
    assert describe_api_error(missing) == (
        "error: No such batch: b (HTTP 404, batch_not_found): check the id: "
        "`batchinfer list` shows your batches"
    )
    assert describe_api_error(gateway) == (
        "error: Request Entity Too Large (HTTP 413): send files over 6 MB through /v1/uploads "
        "(`batchinfer submit` does so by itself)"
    )
    assert describe_api_error(kserve) == "error: inputs[0].shape: must be [1, n] (HTTP 400)"
