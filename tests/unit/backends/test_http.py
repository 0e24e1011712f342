"""The remote backends' HTTP: Retry-After and the one mapping of an upstream status to a `BackendError`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from batchinfer.backends.http import Answer, parse_retry_after, retry_after_of, upstream_error


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("", None),
        ("7", 7.0),
        (" 1.5 ", 1.5),
        ("-3", 0.0),
        ("soon", None),
        ("nan", None),
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),
    ],
)
def test_parse_retry_after_reads_seconds_and_http_dates(header: str | None, seconds: float | None) -> None:
    now = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC).timestamp()

    assert parse_retry_after(header, now=now) == seconds


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after-ms": "250", "retry-after": "1"}, 0.25),  # the milliseconds win
        ({"retry-after-ms": "7"}, 0.007),
        ({"retry-after-ms": "soon", "retry-after": "2"}, 2.0),  # unreadable: the seconds
        ({"retry-after-ms": "-5", "retry-after": "2"}, 2.0),
        ({"retry-after": "3"}, 3.0),
        ({}, None),
    ],
)
def test_retry_after_reads_the_milliseconds_header_first(
    headers: dict[str, str], seconds: float | None
) -> None:
    assert retry_after_of(headers) == seconds


def answer(status: int, body: bytes = b"", retry_after: str | None = None) -> Answer:
    return Answer(status, "Reason", {"retry-after": retry_after} if retry_after else {}, body)


@pytest.mark.parametrize(
    ("status", "given", "expected"),
    [
        # status, (type, code, param) from the server -> (status, type, code, param, retryable, retry_after)
        (429, (None, None, None), (429, "requests", "rate_limit_exceeded", None, True, 2.0)),
        (429, ("tokens", "quota", None), (429, "tokens", "quota", None, True, 2.0)),
        (408, (None, None, None), (408, "server_error", None, None, True, 2.0)),
        (503, (None, None, None), (503, "server_error", None, None, True, 2.0)),
        (500, ("internal", "boom", None), (500, "internal", "boom", None, True, 2.0)),
        (
            400,
            (None, "invalid_value", "top_k"),
            (400, "invalid_request_error", "invalid_value", "top_k", False, None),
        ),
        (401, ("auth", None, None), (401, "auth", None, None, False, None)),
        (302, (None, None, None), (502, "server_error", "bad_response", None, False, None)),
    ],
)
def test_upstream_error_keeps_the_status_and_says_what_may_be_retried(
    status: int, given: tuple[str | None, str | None, str | None], expected: tuple[object, ...]
) -> None:
    error_type, code, param = given

    error = upstream_error(
        answer(status, retry_after="2"), "it failed", type=error_type, code=code, param=param
    )

    assert (
        error.status_code,
        error.type,
        error.code,
        error.param,
        error.retryable,
        error.retry_after,
    ) == expected
    assert error.message == (
        "it failed" if status != 302 else "The model server answered with unexpected HTTP 302: it failed"
    )


def test_answer_summary_is_the_body_text_or_the_status_line() -> None:
    assert answer(503, b"  overloaded \n").summary() == "overloaded"
    assert answer(503, b"x" * 600).summary() == "x" * 500
    assert answer(503).summary() == "HTTP 503 Reason"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [({}, False), ({"HTTPS_PROXY": "http://proxy:3128"}, True), ({"http_proxy": "http://p:1"}, True)],
)
def test_the_proxy_environment_is_read_only_when_a_proxy_is_set(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], expected: bool
) -> None:
    from batchinfer.backends import http

    for name in http.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert http.proxied() is expected
