"""The local HTTP API's rules that need no running stack: route selection, response conversion and
request body encoding in the payload 2.0 event."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from batchinfer_local.functions import HttpApiEventSpec
from batchinfer_local.http import Route, Router, http_api_event, http_response


class Unused:
    """A route's function that routing never calls (nor reads its spec)."""

    def invoke(self, event: Any, *, block: bool = True) -> Any:
        raise AssertionError("not invoked")


def route(path: str | None, method: str = "ANY") -> Route:
    source = HttpApiEventSpec(name="E", Method=method, Path=path)
    return Route.of(Unused(), source)  # type: ignore[arg-type]


def test_most_specific_route_wins() -> None:
    router = Router(
        [
            route(None),
            route("/v1/{proxy+}"),
            route("/v1/items/{id}"),
            route("/v1/items/{id}", "GET"),
            route("/v1/items/all"),
        ]
    )

    def chosen(method: str, path: str) -> tuple[str, dict[str, str]] | None:
        found = router.find(method, path)
        return None if found is None else (found[0].source.route_key, found[1])

    assert chosen("GET", "/v1/items/all") == ("ANY /v1/items/all", {})
    assert chosen("GET", "/v1/items/7") == ("GET /v1/items/{id}", {"id": "7"})
    assert chosen("DELETE", "/v1/items/7") == ("ANY /v1/items/{id}", {"id": "7"})
    assert chosen("GET", "/v1/items/7/x%2Fy") == ("ANY /v1/{proxy+}", {"proxy": "items/7/x/y"})
    assert chosen("GET", "/other") == ("$default", {})
    assert Router([route("/v1/{proxy+}")]).find("GET", "/v1") is None  # greedy needs at least one character
    assert Router([route("/v1/{proxy+}")]).find("GET", "/v1/") is None


def test_a_final_slash_is_its_own_route() -> None:
    # Given the console's three routes: the folder without and with its slash, and its files
    router = Router([route("/console", "GET"), route("/console/", "GET"), route("/console/{proxy+}", "GET")])

    def chosen(path: str) -> str | None:
        found = router.find("GET", path)
        return None if found is None else found[0].source.route_key

    # Then each path goes to its own
    assert chosen("/console") == "GET /console"
    assert chosen("/console/") == "GET /console/"
    assert chosen("/console/app.js") == "GET /console/{proxy+}"
    assert chosen("/console//") == "GET /console/{proxy+}"
    assert Router([route("/console", "GET")]).find("GET", "/console/") is None
    assert Router([route("/console/", "GET")]).find("GET", "/console") is None


def test_greedy_variable_must_be_last() -> None:
    with pytest.raises(ValueError, match="a greedy variable must be the last segment"):
        route("/v1/{proxy+}/x")


def test_response_conversion() -> None:
    plain = http_response({"a": 1})
    assert (plain.status, plain.headers, plain.body) == (
        200,
        [("Content-Type", "application/json")],
        b'{"a": 1}',
    )
    full = http_response(
        {
            "statusCode": 204,
            "headers": {"x-a": 1},
            "cookies": ["k=v"],
            "body": base64.b64encode(b"\xff").decode(),
            "isBase64Encoded": True,
        }
    )
    assert (full.status, full.headers, full.body) == (204, [("x-a", "1"), ("Set-Cookie", "k=v")], b"\xff")
    assert http_response({"statusCode": 200}).body == b""
    with pytest.raises(ValueError, match="invalid statusCode"):
        http_response({"statusCode": "200"})
    with pytest.raises(ValueError, match="body must be a string"):
        http_response({"statusCode": 200, "body": {"a": 1}})


@pytest.mark.parametrize(
    ("content_type", "body", "encoded"),
    [
        ("application/json", b'{"a": 1}', False),
        ("application/json; charset=utf-8", b"{}", False),
        ("text/plain", "é".encode(), False),
        ("application/x-ndjson", b"{}\n", True),
        ("application/vnd.api+json", b"{}", False),
        ("multipart/form-data; boundary=x", b"--x--", True),
        ("application/octet-stream", b"abc", True),
        ("text/plain", b"\xff\xfe", True),  # not UTF-8: cannot travel as text
        (None, b"abc", False),
    ],
)
def test_request_body_encoding(content_type: str | None, body: bytes, encoded: bool) -> None:
    headers = [("Host", "h:1")] + ([("Content-Type", content_type)] if content_type else [])
    event = http_api_event(
        method="POST",
        target="/x",
        headers=headers,
        body=body,
        source_ip="127.0.0.1",
        route=route(None),
        path_parameters={},
        account_id="123456789012",
    )
    assert event["isBase64Encoded"] is encoded
    assert event["body"] == (base64.b64encode(body).decode() if encoded else body.decode())


def test_empty_request_parts_are_left_out() -> None:
    event = http_api_event(
        method="GET",
        target="/x",
        headers=[("Host", "h:1"), ("Connection", "close")],
        body=b"",
        source_ip="10.0.0.1",
        route=route(None),
        path_parameters={},
        account_id="123456789012",
        host_port="1",
    )
    assert sorted(event) == [
        "headers",
        "isBase64Encoded",
        "rawPath",
        "rawQueryString",
        "requestContext",
        "routeKey",
        "version",
    ]
    assert event["headers"] == {
        "host": "h:1",
        "x-forwarded-for": "10.0.0.1",
        "x-forwarded-proto": "http",
        "x-forwarded-port": "1",
    }
    assert (event["routeKey"], event["rawQueryString"], event["isBase64Encoded"]) == ("$default", "", False)
