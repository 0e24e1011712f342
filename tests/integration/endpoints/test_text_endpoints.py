"""`/v1/completions` and `/v1/responses` batches through the pipeline (prepare, the shard worker, the
aggregator) on the scripted OpenAI-compatible model (`support.scripted`), which the `openai` backend
passes each line to at the server's own url; and a file mixing endpoints, failed at validation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchinfer.data import batches
from batchinfer.pipeline import aggregate, prepare
from support.api_stack import HoldableUpstream, jsonl
from support.moto_env import Aws
from support.pipeline import create, prepared, result_lines, run_shard
from support.scripted import SCRIPTED, scripted_model


@pytest.fixture
def upstream(moto_aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldableUpstream]:
    with scripted_model(tmp_path, monkeypatch) as served:
        yield served


def line(custom_id: str, url: str, **body: Any) -> str:
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": SCRIPTED, **body}}
    )


def _bodies(batch_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The response bodies of the output and error files, in line order."""
    header = batches.get(batch_id)
    assert header is not None
    ok = sorted(result_lines(header.output_file_id), key=lambda r: r["custom_id"])
    failed = sorted(result_lines(header.error_file_id), key=lambda r: r["custom_id"])
    return [r["response"]["body"] for r in ok], [r["response"]["body"] for r in failed]


def test_a_completions_batch_answers_one_choice_per_prompt_and_counts_its_tokens(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a completions batch: a single prompt, two prompts, and a line the model refuses
    data = jsonl(
        line("c1", "/v1/completions", prompt="Once", max_tokens=8),
        line("c2", "/v1/completions", prompt=["a", "b"], max_tokens=8),
        line("c3", "/v1/completions", prompt="FAIL"),
    )
    batch_id = prepared(moto_aws, data, monkeypatch, endpoint="/v1/completions")

    # When it runs
    assert [run_shard(batch_id, 0), run_shard(batch_id, 1)] == ["done", "done"]
    assert aggregate.finalize_batch(batch_id) == "completed"

    # Then each line is the server's text_completion, with our model name, and usage adds up
    ok, failed = _bodies(batch_id)
    assert [[(c["index"], c["text"]) for c in body["choices"]] for body in ok] == [
        [(0, "echo: Once")],
        [(0, "echo: a"), (1, "echo: b")],
    ]
    assert {(body["object"], body["model"]) for body in ok} == {("text_completion", SCRIPTED)}
    assert failed[0]["error"]["code"] == "scripted"
    header = batches.get(batch_id)
    assert header is not None
    assert header.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
    assert header.usage.model_dump() == {
        "input_tokens": 6,
        "output_tokens": 4,
        "total_tokens": 10,
        "cached_tokens": 0,
    }


def test_a_responses_batch_counts_input_and_output_tokens(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a Responses batch of two lines
    data = jsonl(
        line("r1", "/v1/responses", input="hello", max_output_tokens=8),
        line("r2", "/v1/responses", input=[{"role": "user", "content": "again"}], instructions="Be brief."),
    )
    batch_id = prepared(moto_aws, data, monkeypatch, endpoint="/v1/responses", shard_size=2)

    # When it runs
    assert run_shard(batch_id, 0) == "done"
    assert aggregate.finalize_batch(batch_id) == "completed"

    # Then each line is the server's Response, and the batch counts its input and output tokens
    ok, failed = _bodies(batch_id)
    assert failed == []
    assert [(b["object"], b["model"], b["output"][0]["content"][0]["text"]) for b in ok] == [
        ("response", SCRIPTED, "echo: hello"),
        ("response", SCRIPTED, "echo: again"),
    ]
    header = batches.get(batch_id)
    assert header is not None
    assert header.usage.model_dump() == {
        "input_tokens": 6,
        "output_tokens": 4,
        "total_tokens": 10,
        "cached_tokens": 0,
    }
    assert sorted(upstream.arrivals) == ["again", "hello"]


def test_a_file_mixing_endpoints_fails_validation_before_any_work(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a Responses batch whose second line is a completions request
    data = jsonl(line("r1", "/v1/responses", input="hello"), line("c1", "/v1/completions", prompt="x"))
    batch_id = create(moto_aws, data, monkeypatch, endpoint="/v1/responses")

    # When prepare validates it
    assert prepare.prepare_batch(batch_id) == "failed"

    # Then the mismatch is named, and nothing reached the model
    header = batches.get(batch_id)
    assert header is not None and header.errors is not None
    assert [e.model_dump() for e in header.errors.data] == [
        {
            "code": "url_mismatch",
            "message": "Line 2: url '/v1/completions' does not match the batch endpoint '/v1/responses'; "
            "all requests of a batch go to its endpoint.",
            "param": "url",
            "line": 2,
        }
    ]
    assert upstream.arrivals == []
