"""The web console's files as the API function serves them (`batchinfer.api.console`), in-process with
the HTTP API events the local gateway builds: types, the Content-Security-Policy, 404s, no way out of
the console's folder, and files that load nothing from anywhere else."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from batchinfer.api.app import app
from batchinfer.api.console import ASSETS, CONTENT_SECURITY_POLICY, assets
from batchinfer_local.functions import HttpApiEventSpec
from batchinfer_local.http import Route, http_api_event

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
FILES = {
    "api.js": "text/javascript; charset=utf-8",
    "batch.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "create.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "format.js": "text/javascript; charset=utf-8",
    "icon.svg": "image/svg+xml",
    "index.html": "text/html; charset=utf-8",
    "list.js": "text/javascript; charset=utf-8",
    "main.js": "text/javascript; charset=utf-8",
}


class Unused:
    """The route's function: the event is resolved here, not through it."""


def get(path: str, route_path: str = "/console/{proxy+}") -> dict[str, Any]:
    """The API function's answer to `GET path` (no key), through the route `GET route_path`."""
    route = Route.of(Unused(), HttpApiEventSpec(name="Console", Method="GET", Path=route_path))  # type: ignore[arg-type]
    event = http_api_event(
        method="GET",
        target=path,
        headers=[("Host", "api.example.com")],
        body=b"",
        source_ip="127.0.0.1",
        route=route,
        path_parameters={},
        account_id="123456789012",
    )
    return app.resolve(event, None)  # type: ignore[arg-type]


def header(response: dict[str, Any], name: str) -> str | None:
    return next((v for k, v in response["headers"].items() if k.lower() == name.lower()), None)


def test_every_file_of_the_folder_is_served_with_its_type() -> None:
    assert CONTENT_SECURITY_POLICY == CSP
    assert {name: content_type for name, (content_type, _) in assets().items()} == FILES
    for name, content_type in FILES.items():
        response = get(f"/console/{name}")
        assert response["statusCode"] == 200, name
        assert header(response, "Content-Type") == content_type
        assert header(response, "Cache-Control") == ("no-cache" if name == "index.html" else "max-age=300")
        assert header(response, "Content-Security-Policy") == CSP
        assert response["body"] == (ASSETS / name).read_text(encoding="utf-8")
        assert response.get("isBase64Encoded") is False


def test_the_page_and_its_headers() -> None:
    # When the console's folder is asked for, with and without its slash
    page = get("/console/", "/console/")
    moved = get("/console", "/console")

    # Then the folder is the page, with the console's headers; without the slash, a redirect to it
    assert page["statusCode"] == 200
    assert page["body"] == (ASSETS / "index.html").read_text(encoding="utf-8")
    assert {name: header(page, name) for name in ("Content-Type", "Content-Security-Policy")} == {
        "Content-Type": "text/html; charset=utf-8",
        "Content-Security-Policy": CSP,
    }
    assert [header(page, n) for n in ("X-Content-Type-Options", "Referrer-Policy", "X-Frame-Options")] == [
        "nosniff",
        "no-referrer",
        "DENY",
    ]
    assert (moved["statusCode"], header(moved, "Location")) == (308, "console/")


@pytest.mark.parametrize(
    "path, message",
    [
        ("/console/nope.js", "The console has no file 'nope.js'."),
        ("/console/..", "The console has no file '..'."),
        ("/console/%2e%2e%2fapi%2fconsole.py", "The console has no file '%2e%2e%2fapi%2fconsole.py'."),
        ("/console/..%2F..%2Fapi%2Fapp.py", "The console has no file '..%2F..%2Fapi%2Fapp.py'."),
        ("/console/console.py", "The console has no file 'console.py'."),
        ("/console/../api/console.py", "no route for GET /console/../api/console.py"),
        ("/console/sub/index.html", "no route for GET /console/sub/index.html"),
    ],
)
def test_anything_else_is_a_404_envelope(path: str, message: str) -> None:
    response = get(path)
    assert response["statusCode"] == 404
    assert json.loads(response["body"])["error"]["message"] == message


def test_the_files_load_nothing_from_elsewhere_and_nothing_inline() -> None:
    texts = {name: text for name, (_, text) in assets().items()}
    page = texts["index.html"]
    # Every file the page and the scripts name is one of the console's own, by a relative path
    named = re.findall(r'(?:src|href)="([^"#]+)"', page)
    imported = [name for text in texts.values() for name in re.findall(r'from "\./([^"]+)"', text)]
    assert sorted(set(named)) == ["console.css", "icon.svg", "main.js"]
    assert set(imported) <= set(FILES) and len(set(imported)) == 6
    # No other origin anywhere (the SVG's namespace is a name, not a request)
    for name, text in texts.items():
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+", text)) - {"http://www.w3.org"}
        assert urls == set(), name
    # No inline script or style, no HTML built from strings
    assert re.findall(r"<script(?![^>]*\bsrc=)", page) == []
    assert all("<style" not in text and " style=" not in text for text in texts.values())
    assert all(
        re.search(r"\binnerHTML\b|\bouterHTML\b|insertAdjacentHTML|\beval\(|new Function", text) is None
        for text in texts.values()
    )
