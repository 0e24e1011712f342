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
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from .functions import HttpApiEventSpec
from .runtime import InvocationError, Invoker

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 10 * 1024 * 1024  # HTTP API payload quota
MAX_INVOKE_BYTES = 6 * 1024 * 1024  # Lambda synchronous invocation payload quota

# The environ key of the request's headers as received (name, value), in order.
_RAW_HEADERS = "batchinfer.raw_headers"
# ... and its target (path and query) as received.
_RAW_TARGET = "batchinfer.raw_target"

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
        """Compile `source.path`: `{name}` matches one segment, a final `{name+}` the rest; a final "/"
        is kept (`/console/` is another route than `/console`)."""
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
        # A route ending in "/" (e.g. `GET /console/`) takes only that path, not the one without it.
        slash = "/" if source.path.endswith("/") and parts and not greedy else ""
        return cls(function, source, re.compile("/" + "/".join(parts) + slash), greedy, literals)

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
    `source_ip` and `host_port`, the server's port). Empty parts (query, cookies, path parameters,
    body) are left out, as API Gateway does.
    """
    now = now or datetime.now(UTC)
    split = urlsplit(target)
    joined, cookies = _event_headers(headers, source_ip, host_port)
    query: dict[str, str] = {}
    for name, value in parse_qsl(split.query, keep_blank_values=True):
        query[name] = f"{query[name]},{value}" if name in query else value
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
    event["requestContext"] = _request_context(method, split.path, joined, source_ip, route, account_id, now)
    if path_parameters:
        event["pathParameters"] = path_parameters
    encoded = bool(body) and not _is_text(joined.get("content-type"), body)
    if body:
        event["body"] = base64.b64encode(body).decode() if encoded else body.decode("utf-8")
    event["isBase64Encoded"] = encoded
    return event


def _event_headers(
    headers: list[tuple[str, str]], source_ip: str, host_port: str
) -> tuple[dict[str, str], list[str]]:
    """The event's `headers` (names lower-cased, repeats joined with commas, hop-by-hop dropped,
    x-forwarded-* added) and its `cookies`."""
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
    return joined, cookies


def _request_context(
    method: str,
    path: str,
    headers: dict[str, str],
    source_ip: str,
    route: Route,
    account_id: str,
    now: datetime,
) -> dict[str, Any]:
    host = headers.get("host", "localhost")
    return {
        "accountId": account_id,
        "apiId": route.source.api_id,
        "domainName": host,
        "domainPrefix": host.split(".", 1)[0],
        "http": {
            "method": method,
            "path": path,
            "protocol": "HTTP/1.1",
            "sourceIp": source_ip,
            "userAgent": headers.get("user-agent", ""),
        },
        "requestId": str(uuid.uuid4()),
        "routeKey": route.source.route_key,
        "stage": "$default",
        "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
        "timeEpoch": int(now.timestamp() * 1000),
    }


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


class _RequestHandler(WSGIRequestHandler):
    """werkzeug's handler (any method reaches the application, as API Gateway routes any), keeping the
    headers as received: its WSGI environ drops names with "_" and joins repeated ones."""

    def make_environ(self) -> WSGIEnvironment:
        environ = super().make_environ()
        environ[_RAW_HEADERS] = list(self.headers.items())
        environ[_RAW_TARGET] = self.path  # RAW_URI is re-encoded (UTF-8 read as Latin-1)
        return environ

    def log(self, type: str, message: str, *args: Any) -> None:
        log.debug("http: " + message, *args)


class BodyTooLarge(Exception):
    """A request body over `MAX_REQUEST_BYTES` (declared, or read so far): the rest is never read."""


def _framed_body(request: Request, headers: list[tuple[str, str]]) -> bytes:
    """The request body, chunked (werkzeug decodes it) or of its Content-Length, read only up to the
    API's limit: a body is never held whole in memory before its size is known.

    Raises:
        ValueError: a Content-Length that is not 1*DIGIT, or two that differ (RFC 9110 8.6: a request
            smuggling attempt), or a malformed chunk; where the request ends is then unknown.
        BodyTooLarge: a Content-Length over `MAX_REQUEST_BYTES` (nothing read), or a chunked body
            that grew past it.
    """
    values = {value.strip() for name, value in headers if name.lower() == "content-length"}
    chunked = request.headers.get("Transfer-Encoding", "").lower() == "chunked"
    if values and not chunked:
        if len(values) > 1 or not re.fullmatch(r"[0-9]+", next(iter(values))):
            raise ValueError(f"invalid Content-Length {sorted(values)}")
        if int(next(iter(values))) > MAX_REQUEST_BYTES:
            raise BodyTooLarge
    try:
        body = request.stream.read(MAX_REQUEST_BYTES + 1)
    except OSError as error:  # werkzeug's DechunkedInput: a chunk size that is not hexadecimal
        raise ValueError(str(error)) from error
    if len(body) > MAX_REQUEST_BYTES:
        raise BodyTooLarge
    return body


class _Response(Response):
    # No Content-Type unless the function sent one, as API Gateway passes its response through.
    default_mimetype = None


class HttpApiServer:
    """A threading HTTP server on `host:port` (0 = a free port) dispatching to the routes' functions.

    Requests are served concurrently (werkzeug's threaded server; each connection carries one request),
    each invoking its function synchronously: up to the function's concurrency at once, further
    requests wait for a free environment (Lambda would throttle them, and API Gateway answer 500:
    locally a burst is slower instead of failing).

    Raises:
        OSError: the port is taken (EADDRINUSE).
    """

    def __init__(self, router: Router, account_id: str, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.router, self.account_id = router, account_id
        # Bound here: werkzeug would print and exit the process on a port in use.
        with socket.create_server((host, port)) as listener:
            # werkzeug serves a duplicate of the bound socket.
            self._server = make_server(
                host,
                listener.getsockname()[1],
                self._application,
                threaded=True,
                request_handler=_RequestHandler,
                fd=listener.fileno(),
            )
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

    def _application(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """The WSGI application: the request as received, through `respond`."""
        request = Request(environ)
        method, target, headers = environ["REQUEST_METHOD"], environ[_RAW_TARGET], environ[_RAW_HEADERS]
        started = time.monotonic()
        try:
            body = _framed_body(request, headers)
        except ValueError:
            response = BAD_REQUEST
        except BodyTooLarge:  # as `respond` answers: no route is a 404 whatever the size
            response = TOO_LARGE if self.router.find(method, urlsplit(target).path or "/") else NOT_FOUND
        else:
            try:
                response = self.respond(method, target, headers, body, request.remote_addr or "")
            except Exception:  # e.g. the stack stopping: API Gateway's 500, not werkzeug's HTML page
                log.exception("%s %s: the request could not be served", method, target)
                response = INTERNAL_ERROR
        log.debug(
            "%s %s -> %d (%.0f ms)", method, target, response.status, (time.monotonic() - started) * 1000
        )
        hidden = ("content-length", "transfer-encoding", "connection")
        sent = [(name, value) for name, value in response.headers if name.lower() not in hidden]
        return _Response(response.body, response.status, sent)(environ, start_response)
