"""A shard's requests (`parse_shard`) and what each one ended in (`Outcome`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The counts of a run of outcomes (a part's, a window's), also a part's S3 metadata.
COUNTS = ("completed", "failed", "input_tokens", "output_tokens", "cached_tokens")


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a shard: its input `line` (1-based), `custom_id` and OpenAI request `body`."""

    line: int
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request ended in: a status code and a response body (a completion or an error envelope),
    or, for a request the model never answered (`status_code` None), a result line's `error`
    `{code, message}`."""

    request: Request
    status_code: int | None
    body: dict[str, Any] | None
    request_id: str | None
    error: dict[str, str] | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and self.status_code < 400


def parse_shard(data: bytes) -> list[Request]:
    """Requests of a shard file: lines `<line>\\t<request JSON>` written by prepare."""
    requests = []
    for raw in data.split(b"\n"):
        if not raw:
            continue
        number, _, line = raw.partition(b"\t")
        obj = json.loads(line)
        requests.append(Request(int(number), obj["custom_id"], obj["body"]))
    return requests
