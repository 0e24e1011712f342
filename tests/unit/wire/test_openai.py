"""Wire shapes: completion windows, metadata limits, result lines (OpenAI Batch API)."""

import json

import pytest
from pydantic import ValidationError

from batchinfer.wire.openai import CreateBatchRequest, result_line, result_line_bytes, window_hours


@pytest.mark.parametrize(("window", "hours"), [("1h", 1), ("24h", 24), ("168h", 168)])
def test_whole_hour_windows(window: str, hours: int) -> None:
    assert window_hours(window) == hours


@pytest.mark.parametrize("window", ["0h", "169h", "24", "1d", "1.5h", "", " 24h"])
def test_other_windows_are_rejected(window: str) -> None:
    with pytest.raises(ValueError, match="completion_window must be whole hours"):
        window_hours(window)


def test_metadata_limits() -> None:
    ok = {f"k{i}": "v" * 512 for i in range(16)}
    assert CreateBatchRequest(input_file_id="f", endpoint="/v1/chat/completions", metadata=ok).metadata == ok
    with pytest.raises(ValidationError, match="at most 16"):
        CreateBatchRequest(
            input_file_id="f", endpoint="/v1/chat/completions", metadata={f"k{i}": "v" for i in range(17)}
        )
    with pytest.raises(ValidationError, match="longer than 64"):
        CreateBatchRequest(input_file_id="f", endpoint="/v1/chat/completions", metadata={"k" * 65: "v"})
    with pytest.raises(ValidationError, match="longer than 512"):
        CreateBatchRequest(input_file_id="f", endpoint="/v1/chat/completions", metadata={"k": "v" * 513})


def test_result_line_shapes() -> None:
    assert result_line(
        line_id="batch_req_1", custom_id="a", status_code=200, request_id="r", body={"x": 1}
    ) == {
        "id": "batch_req_1",
        "custom_id": "a",
        "error": None,
        "response": {"status_code": 200, "request_id": "r", "body": {"x": 1}},
    }
    assert result_line(
        line_id="batch_req_2",
        custom_id="b",
        status_code=None,
        request_id=None,
        body=None,
        error={"code": "batch_expired", "message": "m"},
    ) == {
        "id": "batch_req_2",
        "custom_id": "b",
        "response": None,
        "error": {"code": "batch_expired", "message": "m"},
    }


def test_a_result_line_is_one_compact_utf8_json_line() -> None:
    body = {"choices": [{"message": {"content": "\u4f60\u597d"}}]}

    data = result_line_bytes(
        line_id="batch_req_1", custom_id="caf\u00e9", status_code=200, request_id="r", body=body
    )

    assert (
        data
        == (
            '{"id":"batch_req_1","custom_id":"caf\u00e9","response":{"status_code":200,"request_id":"r",'
            '"body":{"choices":[{"message":{"content":"\u4f60\u597d"}}]}},"error":null}\n'
        ).encode()
    )


def test_a_never_ran_line_has_no_response() -> None:
    data = result_line_bytes(
        line_id="batch_req_2",
        custom_id="b",
        status_code=None,
        request_id=None,
        body=None,
        error={"code": "batch_cancelled", "message": "m"},
    )

    assert data == (
        b'{"id":"batch_req_2","custom_id":"b","response":null,'
        b'"error":{"code":"batch_cancelled","message":"m"}}\n'
    )


def test_a_lone_surrogate_is_written_escaped_so_the_line_stays_utf8() -> None:
    # A custom_id may hold one (`"\\ud800"` is valid JSON and passes validation): the line must not fail.
    data = result_line_bytes(
        line_id="batch_req_3",
        custom_id="a\ud800",
        status_code=400,
        request_id="r",
        body={"error": {"message": "caf\u00e9"}},
    )

    assert data == (
        b'{"id":"batch_req_3","custom_id":"a\\ud800","response":{"status_code":400,"request_id":"r",'
        b'"body":{"error":{"message":"caf\\u00e9"}}},"error":null}\n'
    )
    assert json.loads(data)["custom_id"] == "a\ud800"
