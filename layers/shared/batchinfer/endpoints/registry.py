"""The batch endpoints this service serves, one line each, and how a url finds its endpoint.

Adding an endpoint is a module with an `Endpoint` subclass (see `batchinfer.endpoints.base`) and its
line in `ENDPOINTS`; a test or a plug-in may `register` one at run time.
"""

from __future__ import annotations

import difflib
import re

from batchinfer.endpoints.base import Endpoint
from batchinfer.endpoints.chat import ChatCompletions
from batchinfer.endpoints.completions import Completions
from batchinfer.endpoints.embeddings import Embeddings
from batchinfer.endpoints.infer import TokenInfer
from batchinfer.endpoints.messages import Messages
from batchinfer.endpoints.responses import Responses
from batchinfer.wire.messages import safe

__all__ = ["ENDPOINTS", "OTHER_OPENAI_URLS", "endpoint_for", "find_endpoint", "register", "url_hint"]

# The served endpoints by template, in the order they are listed to users.
ENDPOINTS: dict[str, Endpoint] = {
    endpoint.template: endpoint
    for endpoint in (
        ChatCompletions(),
        TokenInfer(),
        Completions(),
        Responses(),
        Embeddings(),
        Messages(),
    )
}
# Endpoints of the OpenAI Batch API that this service does not serve: a line naming one of them is
# in the wrong batch (`url_mismatch`), not a typo (`invalid_url`).
OTHER_OPENAI_URLS = frozenset({"/v1/moderations"})


def register(endpoint: Endpoint) -> Endpoint:
    """Serve `endpoint` from now on (in this process); returns it. Raises `ValueError` when its
    template is taken."""
    if endpoint.template in ENDPOINTS:
        raise ValueError(f"endpoint {endpoint.template!r} is registered already")
    ENDPOINTS[endpoint.template] = endpoint
    return endpoint


def find_endpoint(url: str) -> tuple[Endpoint, re.Match[str]] | None:
    """The endpoint whose pattern matches the whole `url`, with the match; None when none does."""
    for endpoint in ENDPOINTS.values():
        if match := endpoint.pattern.fullmatch(url):
            return endpoint, match
    return None


def endpoint_for(endpoint: str) -> Endpoint:
    """The endpoint of a batch's `endpoint` value: a template, or a url one matches (the `/v2` url
    of one model). Raises `ValueError` when none is served."""
    found = ENDPOINTS.get(endpoint) or (find_endpoint(endpoint) or (None,))[0]
    if found is None:
        raise ValueError(f"unsupported batch endpoint {endpoint!r}; supported: {', '.join(ENDPOINTS)}")
    return found


def url_hint(url: str) -> str:
    """What to use instead of an unknown url: the fix for a missing slash, or the closest match."""
    listed = [template for template, endpoint in ENDPOINTS.items() if endpoint.listed]
    known = [*listed, *sorted(OTHER_OPENAI_URLS)]
    if not url.startswith("/") and find_endpoint("/" + url):
        return f'urls start with "/": use "/{safe(url)}".'
    if close := difflib.get_close_matches(url, known, n=1, cutoff=0.8):
        return f'did you mean "{close[0]}"?'
    return "known urls: " + ", ".join(f'"{u}"' for u in listed)
