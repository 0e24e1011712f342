"""A made-up endpoint (`support.echo_endpoint`, `/v1/echo`) runs through the whole pipeline once
registered: prepare validates its lines, the shard worker serves them on the model's backend (the
scripted model of `support.scripted`), the aggregator writes its result lines and counts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchinfer.core import ids
from batchinfer.data import batches
from batchinfer.pipeline import aggregate, prepare
from support.api_stack import HoldableUpstream, jsonl
from support.echo_endpoint import ECHO, echo_registered
from support.moto_env import Aws
from support.pipeline import create, prepared, result_lines, run_shard
from support.scripted import SCRIPTED, scripted_model


@pytest.fixture
def upstream(moto_aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldableUpstream]:
    with echo_registered(), scripted_model(tmp_path, monkeypatch) as served:
        yield served


def echo_line(custom_id: str, **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": ECHO, "body": body})


def test_an_echo_batch_runs_to_its_result_lines(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an echo batch of three lines, one the scripted model refuses (FAIL), in two shards
    data = jsonl(
        echo_line("e1", model=SCRIPTED, text="hello"),
        echo_line("e2", model=SCRIPTED, text="FAIL here"),
        echo_line("e3", model=SCRIPTED, text="again"),
    )
    batch_id = prepared(moto_aws, data, monkeypatch, endpoint=ECHO)

    # When its shards run and the aggregator finalizes it
    assert [run_shard(batch_id, 0), run_shard(batch_id, 1)] == ["done", "done"]
    assert aggregate.finalize_batch(batch_id) == "completed"

    # Then each line has the echo endpoint's result body, and the batch counts its usage
    header = batches.get(batch_id)
    assert header is not None
    assert result_lines(header.output_file_id) == [
        {
            "id": ids.request_id(batch_id, line),
            "custom_id": custom_id,
            "response": {
                "status_code": 200,
                "request_id": ids.request_id(batch_id, line),
                "body": {
                    "object": "echo",
                    "model": SCRIPTED,
                    "text": f"echo: {text}",
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                },
            },
            "error": None,
        }
        for line, custom_id, text in [(1, "e1", "hello"), (3, "e3", "again")]
    ]
    assert result_lines(header.error_file_id) == [
        {
            "id": ids.request_id(batch_id, 2),
            "custom_id": "e2",
            "response": {
                "status_code": 400,
                "request_id": ids.request_id(batch_id, 2),
                "body": {
                    "error": {
                        "message": "scripted failure",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "scripted",
                    }
                },
            },
            "error": None,
        }
    ]
    assert header.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
    assert header.usage.model_dump() == {
        "input_tokens": 6,
        "output_tokens": 4,
        "total_tokens": 10,
        "cached_tokens": 0,
    }
    assert sorted(upstream.arrivals) == ["FAIL here", "again", "hello"]


def test_an_echo_line_without_text_fails_the_batch_at_validation(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an echo batch whose second line has no text
    data = jsonl(echo_line("e1", model=SCRIPTED, text="hello"), echo_line("e2", model=SCRIPTED))
    batch_id = create(moto_aws, data, monkeypatch, endpoint=ECHO)

    # When prepare validates it
    assert prepare.prepare_batch(batch_id) == "failed"

    # Then the endpoint's body check names the line, and nothing reached the model
    header = batches.get(batch_id)
    assert header is not None and header.errors is not None
    assert [e.model_dump() for e in header.errors.data] == [
        {
            "code": "missing_required_parameter",
            "message": "Line 2: body.text is missing.",
            "param": "body.text",
            "line": 2,
        }
    ]
    assert upstream.arrivals == []
