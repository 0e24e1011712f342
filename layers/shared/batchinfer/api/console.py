"""`/console/`: the web console, a static single-page app served by this function (docs/console.md).

The files are those of the package's `console/` folder, read once per environment; a name that is not
one of them is a 404, so no path (`..`, an encoded slash) reaches any other file. They are served
without a key (the page asks for one, keeps it in `sessionStorage` and sends it to `/v1` itself), each
with a strict Content-Security-Policy: scripts, styles, images and requests from this origin only, no
inline script or style, no framing.
"""

from __future__ import annotations

import functools
from pathlib import Path

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router

from batchinfer.api.errors import NotFound

router = Router()
PREFIX = "/console"
ASSETS = Path(__file__).resolve().parent.parent / "console"
INDEX = "index.html"
# The media type of each file suffix served; files with other suffixes are not served.
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
# Every answer of the console: no sniffing, no referrer (the page's URL never holds a key, but the
# batch ids in it are the account's own business). The page is revalidated on each load; its scripts,
# styles and icon are kept for ASSET_MAX_AGE seconds (each is a Lambda invocation: a page load then costs
# one, not ten), so a deploy shows within that time.
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
ASSET_MAX_AGE = 300


@functools.cache
def assets() -> dict[str, tuple[str, str]]:
    """The served files: name -> (content type, UTF-8 text), from `ASSETS` (its top level only)."""
    return {
        path.name: (CONTENT_TYPES[path.suffix], path.read_text(encoding="utf-8"))
        for path in sorted(ASSETS.iterdir())
        if path.is_file() and path.suffix in CONTENT_TYPES
    }


def is_console(path: str) -> bool:
    """True for a path of the console (served without a key)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def asset_response(name: str) -> Response:
    """The file `name` of the console with its headers. Raises `NotFound` (404) for any other name."""
    found = assets().get(name)
    if found is None:
        raise NotFound(f"The console has no file '{name[:100]}'.", code="not_found")
    content_type, body = found
    headers = dict(HEADERS)
    if name != INDEX:
        headers["Cache-Control"] = f"max-age={ASSET_MAX_AGE}"
    return Response(status_code=200, content_type=content_type, body=body, headers=headers)


@router.get(PREFIX, include_in_schema=False)
def console_redirect():
    """`/console` -> `/console/` (relative, so that a stage or base path in front is kept): the page's
    files are addressed relative to its folder."""
    return Response(status_code=308, headers={**HEADERS, "Location": "console/"}, body="")


@router.get(f"{PREFIX}/", include_in_schema=False)
def console_index():
    """The console's page."""
    return asset_response(INDEX)


@router.get(f"{PREFIX}/<name>", include_in_schema=False)
def console_asset(name: str):
    """One of the console's scripts, styles or images."""
    return asset_response(name)
