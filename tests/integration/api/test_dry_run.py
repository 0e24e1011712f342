"""`POST /v1/batches` with `"dry_run": true` (api/batches.py, pipeline/dry_run.py) on the API function
in-process, in moto's copy of the template's resources: every problem of the file with its line, the
tokens counted with the embedded model's own tokenizer (the scripted model's estimated), the cost from
the registry's price, and nothing written or queued."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchinfer.backends import load_registry
from batchinfer.backends.token_count import counter_for
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, files, s3
from batchinfer.data.items import FileRecord
from batchinfer.data.table import handle
from support.api_stack import MODEL, chat_line, jsonl
from support.moto_env import Aws, load_event
from support.scripted import SCRIPTED, scripted_model

KEY = "sk-bi-sample-key-for-sam-local-invoke"
CHAT = "/v1/chat/completions"
VALID = jsonl(
    chat_line("a", "Say hello in French.", max_tokens=5),
    chat_line("b", "Und auf Deutsch? ünïcode 日本", max_tokens=7),
    chat_line("c", "Count to three.", max_completion_tokens=3),
)


def uploaded(aws: Aws, data: bytes, file_id: str = "file-dry") -> str:
    s3.put_bytes(aws.bucket, f"files/{file_id}", data)
    files.put(
        FileRecord(
            id=file_id,
            bytes=len(data),
            created_at=1_800_000_000,
            filename="in.jsonl",
            purpose="batch",
            account_id="default",
            bucket=aws.bucket,
            key=f"files/{file_id}",
        )
    )
    return file_id


def dry_run(aws: Aws, file_id: str) -> tuple[int, dict[str, Any]]:
    event = load_event("api-create-batch.json")
    body = {"input_file_id": file_id, "endpoint": CHAT, "dry_run": True}
    event["body"] = json.dumps(body)
    response = aws.invoke("ApiFunction", event)
    return response["statusCode"], json.loads(response["body"])


def stored() -> list[dict[str, Any]]:
    return sorted(handle().scan()["Items"], key=lambda item: (item["PK"], item["SK"]))


@pytest.fixture
def account(moto_aws: Aws) -> Aws:
    accounts.create_key("default", secret=KEY)
    return moto_aws


def test_a_file_with_errors_lists_every_one_and_creates_nothing(
    account: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an account at its limit of one active batch
    monkeypatch.setenv("MAX_ACTIVE_BATCHES", "1")
    get_settings.cache_clear()
    create = load_event("api-create-batch.json")
    create["body"] = json.dumps({"input_file_id": uploaded(account, VALID, "file-ok"), "endpoint": CHAT})
    assert account.invoke("ApiFunction", create)["statusCode"] == 200
    account.messages("PrepareQueue")
    # And a file with a bad line 2, a duplicate custom_id on line 4, another model on line 5
    data = (
        VALID.decode().splitlines()[0]
        + "\n{not json\n\n"
        + VALID.decode().splitlines()[0]
        + "\n"
        + chat_line("z", "hi", model="no-such-model")
        + "\n"
    ).encode()
    file_id = uploaded(account, data)
    before = stored()
    # When it is dry-run
    status, answer = dry_run(account, file_id)
    # Then every problem is listed with its line, and nothing was written or queued
    assert status == 200
    assert answer["object"] == "batch.dry_run"
    assert answer["valid"] is False
    assert [(e["line"], e["code"]) for e in answer["errors"]["data"]] == [
        (2, "invalid_json_line"),
        (4, "duplicate_custom_id"),
        (5, "model_mismatch"),
    ]
    assert answer["error_count"] == 3
    assert answer["request_counts"] == {"total": 4, "valid": 1}
    assert stored() == before
    assert account.messages("PrepareQueue") == []
    assert account.invoke("ApiFunction", create)["statusCode"] == 429  # the limit is as it was


def test_a_valid_file_is_counted_with_the_models_tokenizer_and_priced(account: Aws) -> None:
    # Given a valid file for the embedded model, which has a price
    file_id = uploaded(account, VALID)
    config = load_registry(get_settings().model_registry).config(MODEL)
    counter = counter_for(config)
    bodies = [json.loads(line)["body"] for line in VALID.splitlines()]
    expected_in = sum(counter.count("/v1/chat/completions", body) for body in bodies)
    # When it is dry-run
    status, answer = dry_run(account, file_id)
    # Then its tokens are the tokenizer's, its output at most the lines' caps (max_completion_tokens first)
    assert status == 200
    assert answer["valid"] is True
    assert answer["model"] == MODEL
    assert answer["errors"] == {"object": "list", "data": []}
    assert answer["request_counts"] == {"total": 3, "valid": 3}
    assert expected_in == 113  # SmolLM2's template adds its default system prompt to each
    assert answer["usage"] == {
        "input_tokens": expected_in,
        "output_tokens": 5 + 7 + 3,
        "total_tokens": expected_in + 15,
        "input_tokens_method": "tokenizer",
    }
    assert answer["estimated_cost"] == {
        "currency": "USD",
        "input": 2.26e-06,  # 113 tokens at 0.02 a million
        "output": 6e-07,
        "total": 2.86e-06,
    }
    assert account.messages("PrepareQueue") == []


def test_a_remote_model_is_estimated_and_unpriced(
    account: Aws, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a file for a model served by an OpenAI-compatible server, with no price and no max_tokens
    body = {"model": SCRIPTED, "messages": [{"role": "user", "content": "x" * 37}]}
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    file_id = uploaded(account, json.dumps(line).encode() + b"\n")
    with scripted_model(tmp_path, monkeypatch) as upstream:
        # When it is dry-run
        status, answer = dry_run(account, file_id)
    # Then its input is estimated from its bytes, its output is the fallback cap, and it has no cost
    assert status == 200
    messages = json.dumps({"messages": body["messages"]}, separators=(",", ":"))
    assert answer["usage"] == {
        "input_tokens": -(-len(messages) // 4),
        "output_tokens": 256,
        "total_tokens": -(-len(messages) // 4) + 256,
        "input_tokens_method": "estimate",
    }
    assert answer["estimated_cost"] is None
    assert upstream.arrivals == []  # the server was never asked
