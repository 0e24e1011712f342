"""The local HTTP API's transport (werkzeug) with a recording function: any method reaches the routing,
as API Gateway's HTTP API routes it; framing errors are a 400; the function's response goes back as is."""

from __future__ import annotations

import errno
import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchinfer_local.functions import FunctionSpec, HttpApiEventSpec
from batchinfer_local.http import HttpApiServer, Route, Router

SPEC = FunctionSpec(
    logical_id="Fn",
    function_name="stack-Fn",
    function_arn="arn:aws:lambda:us-east-1:123456789012:function:stack-Fn",
    handler_file=Path("/code/app.py"),
    handler_name="handler",
)


class Recorder:
    """A route's function that records each event and answers with `answer`."""

    spec = SPEC

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.answer: Any = {"statusCode": 200, "headers": {"content-type": "application/json"}, "body": "{}"}

    def invoke(self, event: Any, *, block: bool = True) -> Any:
        self.events.append(event)
        return self.answer


@pytest.fixture
def api() -> Iterator[tuple[HttpApiServer, Recorder]]:
    function = Recorder()
    routes = [Route.of(function, HttpApiEventSpec(name="Api", Method="ANY", Path="/v1/{proxy+}"))]  # type: ignore[arg-type]
    server = HttpApiServer(Router(routes), "123456789012", port=0)
    server.start()
    try:
        yield server, function
    finally:
        server.stop()


def raw(server: HttpApiServer, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `data` as is and read one response: status, headers (lower-cased names), body."""
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def test_an_undeclared_method_reaches_the_route_that_takes_any(api: tuple[HttpApiServer, Recorder]) -> None:
    server, function = api

    response = httpx.request("TRACE", f"{server.base_url}/v1/batches")

    assert (response.status_code, response.json()) == (200, {})
    [event] = function.events
    assert (event["requestContext"]["http"]["method"], event["routeKey"], event["rawPath"]) == (
        "TRACE",
        "ANY /v1/{proxy+}",
        "/v1/batches",
    )


def test_a_method_and_path_no_route_takes_is_api_gateways_404(api: tuple[HttpApiServer, Recorder]) -> None:
    server, function = api

    response = httpx.request("TRACE", f"{server.base_url}/elsewhere")

    assert (response.status_code, response.headers["content-type"], response.json()) == (
        404,
        "application/json",
        {"message": "Not Found"},
    )
    assert function.events == []


def test_a_chunked_body_arrives_whole_and_headers_as_sent(api: tuple[HttpApiServer, Recorder]) -> None:
    server, function = api

    status, _, _ = raw(
        server,
        b"POST /v1/files?a=1&a=2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX_Under: u\r\n"
        b"Cookie: c=1\r\nCookie: d=2\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    )

    [event] = function.events
    assert status == 200
    assert (event["body"], event["rawQueryString"], event["queryStringParameters"]) == (
        "abcde",
        "a=1&a=2",
        {"a": "1,2"},
    )
    assert (event["headers"]["x_under"], event["cookies"]) == ("u", ["c=1", "d=2"])


@pytest.mark.parametrize(
    "header",
    [b"Content-Length: abc", b"Content-Length: 2\r\nContent-Length: 40", b"Transfer-Encoding: chunked"],
)
def test_framing_that_is_not_a_number_is_a_400_that_closes(
    api: tuple[HttpApiServer, Recorder], header: bytes
) -> None:
    server, function = api

    status, headers, body = raw(
        server, b"POST /v1/files HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n\r\nzz\r\n"
    )

    assert (status, headers["connection"], json.loads(body)) == (400, "close", {"message": "Bad Request"})
    assert function.events == []


@pytest.mark.parametrize(("path", "status"), [(b"/v1/files", 413), (b"/nowhere", 404)])
def test_a_body_declared_over_the_limit_is_refused_before_it_is_read(
    api: tuple[HttpApiServer, Recorder], path: bytes, status: int
) -> None:
    server, function = api
    # Given a request declaring 200 MiB of which it sends only a few bytes (the rest never comes)
    head = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 209715200\r\n\r\n"

    # Then the answer comes at once (the raw client times out after 10 s): nothing waits for the body
    answered, _, _ = raw(server, head + b"zz")

    assert (answered, function.events) == (status, [])


def test_a_chunked_body_over_the_limit_is_a_413_read_no_further(api: tuple[HttpApiServer, Recorder]) -> None:
    server, function = api
    chunk = b"%x\r\n" % (1024 * 1024) + b"a" * (1024 * 1024) + b"\r\n"
    head = b"POST /v1/files HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"

    # 10 MiB and 100 bytes, no last chunk: it is never needed
    answered, _, _ = raw(server, head + chunk * 10 + b"64\r\n" + b"a" * 100 + b"\r\n")

    assert (answered, function.events) == (413, [])


def test_the_functions_response_goes_back_without_a_content_type_it_did_not_set(
    api: tuple[HttpApiServer, Recorder],
) -> None:
    server, function = api
    function.answer = {"statusCode": 204, "cookies": ["a=1", "b=2"], "headers": {"x-one": "1"}}

    response = httpx.delete(f"{server.base_url}/v1/files/f")
    head = httpx.head(f"{server.base_url}/v1/files/f")

    assert (response.status_code, response.content) == (204, b"")
    assert "content-type" not in response.headers
    assert (response.headers["x-one"], response.headers.get_list("set-cookie")) == ("1", ["a=1", "b=2"])
    assert (head.status_code, head.content) == (204, b"")


def test_a_port_in_use_is_an_os_error_not_an_exit() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError) as raised:
            HttpApiServer(Router([]), "123456789012", port=taken.getsockname()[1])
    assert raised.value.errno == errno.EADDRINUSE
