"""Unit tests of `batchinfer.endpoints.registry`: the served endpoints and how a url finds one."""

from __future__ import annotations

import re
from typing import Any

import pytest

from batchinfer.endpoints import registry
from batchinfer.endpoints.base import Endpoint, Usage
from batchinfer.endpoints.chat import ChatCompletions
from batchinfer.endpoints.completions import Completions
from batchinfer.endpoints.embeddings import Embeddings
from batchinfer.endpoints.infer import TokenInfer
from batchinfer.endpoints.messages import Messages
from batchinfer.endpoints.responses import Responses
from batchinfer.wire.line_errors import LineError

CHAT, INFER = "/v1/chat/completions", "/v2/models/{model}/infer"


class _Made(Endpoint):
    template, pattern, model_param = "/v1/made-up", re.compile("/v1/made-up"), "body.model"

    def check_body(self, body: dict[str, Any], line: int) -> list[LineError]:
        return []

    def model_of(self, match: re.Match[str], body: dict[str, Any]) -> str | None:
        return None

    def usage(self, result: dict[str, Any]) -> Usage:
        return Usage()


def test_the_registry_lists_every_endpoint_in_order() -> None:
    assert list(registry.ENDPOINTS) == [
        CHAT,
        INFER,
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/messages",
    ]
    assert [type(e) for e in registry.ENDPOINTS.values()] == [
        ChatCompletions,
        TokenInfer,
        Completions,
        Responses,
        Embeddings,
        Messages,
    ]


@pytest.mark.parametrize(
    ("url", "template", "groups"),
    [
        (CHAT, CHAT, {}),
        ("/v2/models/m-1/infer", INFER, {"model": "m-1"}),
        ("/v2/models/{model}/infer", INFER, {"model": "{model}"}),
    ],
)
def test_find_endpoint_matches_whole_urls(url: str, template: str, groups: dict[str, str]) -> None:
    found = registry.find_endpoint(url)

    assert found is not None
    assert (found[0].template, found[1].groupdict()) == (template, groups)


@pytest.mark.parametrize("url", ["/v1/chat/completions/", "v1/chat/completions", "/v2/models/a/b/infer", ""])
def test_find_endpoint_finds_nothing_for_other_urls(url: str) -> None:
    assert registry.find_endpoint(url) is None


def test_endpoint_for_takes_a_template_or_a_url_it_matches() -> None:
    assert registry.endpoint_for(INFER) is registry.ENDPOINTS[INFER]
    assert registry.endpoint_for("/v2/models/m/infer") is registry.ENDPOINTS[INFER]
    with pytest.raises(ValueError) as caught:
        registry.endpoint_for("/v1/moderations")
    assert str(caught.value) == (
        "unsupported batch endpoint '/v1/moderations'; supported: /v1/chat/completions, "
        "/v2/models/{model}/infer, /v1/completions, /v1/responses, /v1/embeddings, /v1/messages"
    )


def test_register_adds_an_endpoint_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "ENDPOINTS", dict(registry.ENDPOINTS))
    made = _Made()

    assert registry.register(made) is made
    assert registry.endpoint_for("/v1/made-up") is made
    with pytest.raises(ValueError, match="endpoint '/v1/made-up' is registered already"):
        registry.register(_Made())


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("v1/chat/completions", 'urls start with "/": use "/v1/chat/completions".'),
        ("/v1/chat/completion", 'did you mean "/v1/chat/completions"?'),
        ("/v1/embedding", 'did you mean "/v1/embeddings"?'),
        (
            "/x",
            'known urls: "/v1/chat/completions", "/v2/models/{model}/infer", "/v1/completions", '
            '"/v1/responses", "/v1/embeddings"',
        ),
    ],
)
def test_url_hint(url: str, hint: str) -> None:
    assert registry.url_hint(url) == hint
