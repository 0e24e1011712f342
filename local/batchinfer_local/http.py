"""A local stand-in for API Gateway HTTP APIs: routes requests to handlers as payload 2.0 events.

Event and response formats:
https://docs.aws.amazon.com/apigateway/latest/developerguide/http-api-develop-integrations-lambda.html
Route selection ("most specific match wins"):
https://docs.aws.amazon.com/apigateway/latest/developerguide/http-api-develop-routes.html
Payload quotas (10 MB request; 6 MB Lambda invocation payload):
https://docs.aws.amazon.com/apigateway/latest/developerguide/http-api-quotas.html
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .functions import HttpApiEventSpec
from .runtime import InvocationError, Invoker

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 10 * 1024 * 1024  # HTTP API payload quota
MAX_INVOKE_BYTES = 6 * 1024 * 1024  # Lambda synchronous invocation payload quota

# Connection-level headers, which a proxy does not forward.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"})

# Content types API Gateway passes as text; every other body is base64-encoded.
_TEXT_TYPES = re.compile(
    r"^(text/.*|application/(json|xml|javascript|x-www-form-urlencoded)|application/[^;]*\+(json|xml))$"
)


@dataclass(frozen=True)
class Route:
    """One route: a function and its `Method Path` (or `$default`), compiled for matching."""

    function: Invoker
    source: HttpApiEventSpec
    pattern: re.Pattern[str] | None
    greedy: bool
    literal_segments: int

    @classmethod
    def of(cls, function: Invoker, source: HttpApiEventSpec) -> Route:
        """Compile `source.path`: `{name}` matches one segment, a final `{name+}` the rest."""
        if source.path is None:
            return cls(function, source, None, True, -1)
        parts, greedy, literals = [], False, 0
        segments = source.path.strip("/").split("/") if source.path.strip("/") else []
        for index, segment in enumerate(segments):
            variable = re.fullmatch(r"\{([A-Za-z0-9_.-]+)(\+?)\}", segment)
            if variable and variable.group(2):
                if index != len(segments) - 1:
                    raise ValueError(f"{source.route_key}: a greedy variable must be the last segment")
                parts.append(f"(?P<{_group(variable.group(1))}>.+)")
                greedy = True
            elif variable:
                parts.append(f"(?P<{_group(variable.group(1))}>[^/]+)")
            else:
                parts.append(re.escape(segment))
                literals += 1
        return cls(function, source, re.compile("/" + "/".join(parts)), greedy, literals)

    def match(self, method: str, path: str) -> dict[str, str] | None:
        """Path parameters (URL-decoded) if the route takes `method` and `path`, else None."""
        if self.pattern is None:
            return {}
        if self.source.method.upper() not in ("ANY", method):
            return None
        found = self.pattern.fullmatch(path)
        if found is None:
            return None
        names = _names(self.source.path or "")
        return {names[group]: unquote(value) for group, value in found.groupdict().items()}

    def rank(self) -> tuple[int, int, int, int]:
        """Sort key: full routes before greedy ones before `$default`, more literals first, methods
        before ANY."""
        return (
            self.pattern is None,
            self.greedy,
            -self.literal_segments,
            self.source.method.upper() == "ANY",
        )


def _group(name: str) -> str:
    return "p_" + re.sub(r"\W", "_", name)


def _names(path: str) -> dict[str, str]:
    return {_group(name): name for name in re.findall(r"\{([A-Za-z0-9_.-]+)\+?\}", path)}


class Router:
    """Chooses the route for a request."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = sorted(routes, key=Route.rank)

    def find(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The most specific route taking `method` and `path` with its path parameters, or None."""
        for route in self.routes:
            parameters = route.match(method, path)
            if parameters is not None:
                return route, parameters
        return None


def _is_text(content_type: str | None, body: bytes) -> bool:
    if content_type is None:
        return _utf8(body)
    media_type = content_type.split(";", 1)[0].strip().lower()
    return bool(_TEXT_TYPES.match(media_type)) and _utf8(body)


def _utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def http_api_event(
    *,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes,
    source_ip: str,
    route: Route,
    path_parameters: dict[str, str],
    account_id: str,
    host_port: str = "80",
    now: datetime | None = None,
) -> dict[str, Any]:
    """The HTTP API payload format 2.0 event for one request.

    `target` is the request target (path and query, percent-encoded as received); `headers`
    are in arrival order (repeated names are joined with commas, names lower-cased, cookies
    moved to `cookies`, hop-by-hop headers dropped, x-forwarded-for/-proto/-port added with
    `source_ip` and `host_port`, the server's port). Empty parts (query, cookies, path parameters, body) are
    left out, as
    API Gateway does.
    """
    now = now or datetime.now(UTC)
    split = urlsplit(target)
    joined: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in headers:
        key = name.lower()
        if key in _HOP_BY_HOP:
            continue
        if key == "cookie":
            cookies.extend(part.strip() for part in value.split(";") if part.strip())
            continue
        joined[key] = f"{joined[key]},{value}" if key in joined else value
    # API Gateway tells the integration who called and how (the local server speaks plain HTTP).
    forwarded_for = joined.get("x-forwarded-for")
    joined["x-forwarded-for"] = f"{forwarded_for},{source_ip}" if forwarded_for else source_ip
    joined.setdefault("x-forwarded-proto", "http")
    joined.setdefault("x-forwarded-port", host_port)
    query: dict[str, str] = {}
    for name, value in parse_qsl(split.query, keep_blank_values=True):
        query[name] = f"{query[name]},{value}" if name in query else value
    host = joined.get("host", "localhost")
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route.source.route_key,
        "rawPath": split.path,
        "rawQueryString": split.query,
    }
    if cookies:
        event["cookies"] = cookies
    event["headers"] = joined
    if query:
        event["queryStringParameters"] = query
    event["requestContext"] = {
        "accountId": account_id,
        "apiId": route.source.api_id,
        "domainName": host,
        "domainPrefix": host.split(".", 1)[0],
        "http": {
            "method": method,
            "path": split.path,
            "protocol": "HTTP/1.1",
            "sourceIp": source_ip,
            "userAgent": joined.get("user-agent", ""),
        },
        "requestId": str(uuid.uuid4()),
        "routeKey": route.source.route_key,
        "stage": "$default",
        "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
        "timeEpoch": int(now.timestamp() * 1000),
    }
    if path_parameters:
        event["pathParameters"] = path_parameters
    encoded = bool(body) and not _is_text(joined.get("content-type"), body)
    if body:
        event["body"] = base64.b64encode(body).decode() if encoded else body.decode("utf-8")
    event["isBase64Encoded"] = encoded
    return event


@dataclass(frozen=True)
class HttpResponse:
    """What goes back to the client: status, headers (name, value) in order, and the body bytes."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def _json_response(status: int, message: str) -> HttpResponse:
    return HttpResponse(
        status, [("Content-Type", "application/json")], json.dumps({"message": message}).encode()
    )


BAD_REQUEST = _json_response(400, "Bad Request")
NOT_FOUND = _json_response(404, "Not Found")
INTERNAL_ERROR = _json_response(500, "Internal Server Error")
# The OpenAI envelope with the way out, where a deployed HTTP API answers {"message": "Request Entity
# Too Large"} (HTTP APIs have no customisable gateway responses; clients must read both, as the CLI does).
TOO_LARGE = HttpResponse(
    413,
    [("Content-Type", "application/json")],
    json.dumps(
        {
            "error": {
                "message": "Request Entity Too Large: a request carries at most 10 MB (6 MB once in the "
                "function's event); send large files through /v1/uploads (create an Upload, PUT the "
                "bytes to its upload_url, then complete it).",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_too_large",
            }
        }
    ).encode(),
)


def http_response(result: Any) -> HttpResponse:
    """Turn a handler's result into the HTTP response API Gateway would send (payload 2.0 rules).

    A result without `statusCode` is a 200 `application/json` response whose body is the result.

    Raises:
        ValueError: a malformed response (API Gateway answers 500 then).
    """
    if not (isinstance(result, dict) and "statusCode" in result):
        body = result if isinstance(result, str) else json.dumps(result)
        return HttpResponse(200, [("Content-Type", "application/json")], body.encode())
    status = result["statusCode"]
    if not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"invalid statusCode {status!r}")
    headers = [(str(name), str(value)) for name, value in (result.get("headers") or {}).items()]
    headers += [("Set-Cookie", str(cookie)) for cookie in result.get("cookies") or []]
    body = result.get("body") or ""
    if not isinstance(body, str):
        raise ValueError("body must be a string")
    data = base64.b64decode(body) if result.get("isBase64Encoded") else body.encode("utf-8")
    return HttpResponse(status, headers, data)


class HttpApiServer:
    """A threading HTTP server on `host:port` (0 = a free port) dispatching to the routes' functions.

    Requests are served concurrently, each invoking its function synchronously: up to the function's
    concurrency at once, further requests wait for a free environment (Lambda would throttle them,
    and API Gateway answer 500: locally a burst is slower instead of failing).
    """

    def __init__(self, router: Router, account_id: str, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.router, self.account_id = router, account_id
        self._server = ThreadingHTTPServer((host, port), self._request_handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """`http://<host>:<port>` of the listening socket."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="http-api", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def respond(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes, source_ip: str
    ) -> HttpResponse:
        """Route one request, invoke its handler and build the response (404/413/500 as API Gateway)."""
        path = urlsplit(target).path or "/"
        found = self.router.find(method, path)
        if found is None:
            return NOT_FOUND
        if len(body) > MAX_REQUEST_BYTES:
            return TOO_LARGE
        route, parameters = found
        event = http_api_event(
            method=method,
            target=target,
            headers=headers,
            body=body,
            source_ip=source_ip,
            route=route,
            path_parameters=parameters,
            account_id=self.account_id,
            host_port=str(self._server.server_address[1]),
        )
        if len(json.dumps(event)) > MAX_INVOKE_BYTES:
            log.warning("%s %s: event exceeds Lambda's 6 MB invocation payload limit", method, path)
            return TOO_LARGE
        try:
            return http_response(route.function.invoke(event))
        except InvocationError as error:
            log.error("%s %s: %s", method, path, error)
            return INTERNAL_ERROR
        except ValueError:
            log.exception(
                "%s %s: %s returned a malformed response", method, path, route.function.spec.logical_id
            )
            return INTERNAL_ERROR

    def _request_handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as HTTP clients expect
            disable_nagle_algorithm = True  # small responses would otherwise wait ~40 ms for a delayed ACK

            def _handle(self) -> None:
                try:
                    body = self._read_body()
                except ValueError:  # a Content-Length or chunk size that is not a number, or negative
                    self.close_connection = True  # where this request ends is unknown: no next one
                    self._send(BAD_REQUEST)
                    return
                started = time.monotonic()
                response = api.respond(
                    self.command, self.path, list(self.headers.items()), body, self.client_address[0]
                )
                log.debug(
                    "%s %s -> %d (%.0f ms)",
                    self.command,
                    self.path,
                    response.status,
                    (time.monotonic() - started) * 1000,
                )
                self._send(response)

            def _send(self, response: HttpResponse) -> None:
                self.send_response(response.status)
                for name, value in response.headers:
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(response.body)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(response.body)

            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                # RFC 9110 8.6: 1*DIGIT, and one value (two that differ are a request smuggling attempt)
                values = {value.strip() for value in self.headers.get_all("Content-Length") or []}
                if not values:
                    return b""
                if len(values) > 1 or not re.fullmatch(r"[0-9]+", next(iter(values))):
                    raise ValueError(f"invalid Content-Length {sorted(values)}")
                return self.rfile.read(int(values.pop()))

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http: " + format, *args)

        return Handler
