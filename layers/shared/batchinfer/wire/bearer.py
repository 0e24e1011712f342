"""The bearer token of an HTTP request (RFC 6750 section 2.1), shared by `/v1` (`api.auth`) and `/v2`
(`infer.app`): both take the same API keys, looked up by `data.accounts.authenticate`.

Twelve lines of header parsing; no library is worth a dependency for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# RFC 6750 section 2.1's b64token, at most 256 characters (a key is 49): anything else is no key, refused
# without a table read.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]{1,256}={0,2}")

# RFC 6750 section 3: a 401 names the scheme the resource takes.
WWW_AUTHENTICATE = {"WWW-Authenticate": 'Bearer realm="batchinfer"'}


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (header name and scheme case-insensitive,
    surrounding spaces ignored), else None (no header, another scheme, an empty token)."""
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def well_formed(token: str) -> bool:
    """Whether `token` can be an API key at all: RFC 6750's b64token, at most 256 characters."""
    return _TOKEN.fullmatch(token) is not None
