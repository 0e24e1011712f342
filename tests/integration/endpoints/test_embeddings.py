"""An embeddings batch through the whole pipeline on an OpenAI-compatible server (the loopback
`HoldableUpstream` of `support.api_stack`, behind the registry's `openai` backend): prepare validates
it, the shard worker passes each body to the server's `/embeddings`, the aggregator writes OpenAI's
result bodies and counts input tokens only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchinfer.core import ids
from batchinfer.data import batches
from batchinfer.pipeline import aggregate, prepare
from support.api_stack import HoldableUpstream, jsonl
from support.moto_env import Aws
from support.pipeline import create, prepared, result_lines, run_shard
from support.scripted import SCRIPTED, scripted_model

EMBEDDINGS = "/v1/embeddings"


@pytest.fixture
def upstream(moto_aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldableUpstream]:
    with scripted_model(tmp_path, monkeypatch) as served:
        yield served


def embeddings_line(custom_id: str, **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": EMBEDDINGS, "body": body})


def test_an_embeddings_batch_runs_to_openai_result_bodies(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an embeddings batch of three lines (a string, two strings, one the server refuses)
    data = jsonl(
        embeddings_line("e1", model=SCRIPTED, input="hello"),
        embeddings_line("e2", model=SCRIPTED, input=["FAIL here"]),
        embeddings_line("e3", model=SCRIPTED, input=["ab", "abc"], user="u1"),
    )
    batch_id = prepared(moto_aws, data, monkeypatch, endpoint=EMBEDDINGS)

    # When its shards run and the aggregator finalizes it
    assert [run_shard(batch_id, 0), run_shard(batch_id, 1)] == ["done", "done"]
    assert aggregate.finalize_batch(batch_id) == "completed"

    # Then each success line carries OpenAI's embeddings body with our model name
    header = batches.get(batch_id)
    assert header is not None
    bodies = [line["response"]["body"] for line in result_lines(header.output_file_id)]
    assert bodies == [
        {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [5.0, 0.5]}],
            "model": SCRIPTED,
            "usage": {"prompt_tokens": 2, "total_tokens": 2},
        },
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": 0, "embedding": [2.0, 0.5]},
                {"object": "embedding", "index": 1, "embedding": [3.0, 0.5]},
            ],
            "model": SCRIPTED,
            "usage": {"prompt_tokens": 4, "total_tokens": 4},
        },
    ]
    [failed] = result_lines(header.error_file_id)
    assert failed["id"] == ids.request_id(batch_id, 2)
    assert failed["response"]["status_code"] == 400
    # And the batch counts input tokens only
    assert header.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
    assert header.usage.model_dump() == {
        "input_tokens": 6,
        "output_tokens": 0,
        "total_tokens": 6,
        "cached_tokens": 0,
    }


def test_an_embeddings_batch_over_50000_inputs_fails_validation(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 25 lines of 2,000 inputs and one more line of one input: 50,001 inputs
    many = ["x"] * 2000
    lines = [embeddings_line(f"e{i}", model=SCRIPTED, input=many) for i in range(25)]
    data = jsonl(*lines, embeddings_line("last", model=SCRIPTED, input="y"))
    batch_id = create(moto_aws, data, monkeypatch, endpoint=EMBEDDINGS)

    # When prepare validates it
    assert prepare.prepare_batch(batch_id) == "failed"

    # Then one batch-level error says so, and nothing reached the model
    header = batches.get(batch_id)
    assert header is not None and header.errors is not None
    assert [e.model_dump() for e in header.errors.data] == [
        {
            "code": "too_many_tasks",
            "message": "The batch has 50001 inputs; the limit is 50000 inputs per batch.",
            "param": None,
            "line": None,
        }
    ]
    assert upstream.arrivals == []
