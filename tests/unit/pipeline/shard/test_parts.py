"""Result lines of a part."""

import json

from batchinfer.endpoints.registry import endpoint_for
from batchinfer.pipeline.shard.parts import render
from batchinfer.pipeline.shard.requests import Outcome, Request

CHAT = endpoint_for("/v1/chat/completions")


def test_render_puts_successes_first_and_counts_tokens() -> None:
    ok = Outcome(Request(1, "a", {}), 200, {"usage": {"prompt_tokens": 3, "completion_tokens": 2}}, "r1")
    bad = Outcome(Request(2, "b", {}), 400, {"error": {"message": "m"}}, "r2")
    ok2 = Outcome(Request(3, "c", {}), 200, {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}, "r3")
    data, output_bytes, counts = render("batch_x", [ok, bad, ok2], CHAT)
    lines = [json.loads(line) for line in data.splitlines()]
    assert [line["custom_id"] for line in lines] == ["a", "c", "b"]
    assert data[:output_bytes].count(b"\n") == 2
    assert lines[2]["response"] == {
        "status_code": 400,
        "request_id": "r2",
        "body": {"error": {"message": "m"}},
    }
    assert counts == {"completed": 2, "failed": 1, "input_tokens": 4, "output_tokens": 3, "cached_tokens": 0}
