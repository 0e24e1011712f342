"""The batch commands without a stack: their options, the status summary and the ending line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchinfer_local import cli
from batchinfer_local.cli.batches import ending_line, file_endpoint, metadata, status_lines
from batchinfer_local.client import BatchClient


def test_submit_takes_the_batch_options() -> None:
    args = cli.build_parser().parse_args(
        [
            "submit",
            "f.jsonl",
            "--endpoint",
            "/v2/models/m/infer",
            "--completion-window",
            "2h",
            "--metadata",
            "a=1",
            "--metadata",
            "b=x=y",
            "--output-expires-after",
            "3600",
        ]
    )
    assert (args.endpoint, args.completion_window, args.output_expires_after) == (
        "/v2/models/m/infer",
        "2h",
        3600,
    )
    assert metadata(args.metadata) == {"a": "1", "b": "x=y"}


def test_metadata_without_an_equals_sign_is_a_usage_error() -> None:
    with pytest.raises(cli.CliError) as raised:
        metadata(["nope"])
    assert (str(raised.value), raised.value.code) == ("error: --metadata 'nope' is not KEY=VALUE", 2)


def _finished(status: str, **fields: object) -> dict:
    return {
        "id": "batch_1",
        "status": status,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "request_counts": {"total": 3, "completed": 1, "failed": 1},
        "created_at": 1_700_000_000,
        **fields,
    }


def test_status_is_a_short_summary_with_counts_and_times() -> None:
    # Given a completed batch and one still running
    done = _finished("completed", completed_at=1_700_000_065)
    running = _finished("in_progress")

    # Then the summary is its id, status, endpoint, counts, created and ended
    assert status_lines(done) == [
        "batch_1: completed, /v1/chat/completions, 1/3 done, 1 failed",
        "created 2023-11-14 22:13:20 UTC, ended 2023-11-14 22:14:25 UTC",
    ]
    assert status_lines(running)[1] == "created 2023-11-14 22:13:20 UTC"


def test_status_of_a_failed_batch_lists_its_errors() -> None:
    failed = _finished(
        "failed",
        failed_at=1_700_000_001,
        errors={"data": [{"code": "model_not_found", "message": "no model m", "line": 2}]},
    )
    assert status_lines(failed) == [
        "batch_1: failed, /v1/chat/completions, 1/3 done, 1 failed",
        "created 2023-11-14 22:13:20 UTC, ended 2023-11-14 22:13:21 UTC",
        "  line 2: model_not_found: no model m",
    ]


@pytest.mark.parametrize(
    ("batch", "line"),
    [
        (_finished("cancelled"), "error: batch batch_1 was cancelled (1/3 done, 1 failed)"),
        (
            _finished("expired"),
            "error: batch batch_1 expired: its completion window (24h) passed (1/3 done, 1 failed)",
        ),
        (
            _finished(
                "failed",
                errors={
                    "data": [
                        {"code": "model_not_found", "message": "no model m", "line": 1},
                        {"code": "model_not_found", "message": "no model m", "line": 2},
                    ]
                },
            ),
            "error: batch batch_1 failed: line 1: model_not_found: no model m (and 1 more) "
            "(1/3 done, 1 failed)",
        ),
    ],
    ids=["cancelled", "expired", "failed"],
)
def test_a_batch_that_did_not_complete_ends_in_one_line_saying_how_and_why(batch: dict, line: str) -> None:
    assert ending_line(batch) == line


def test_wait_on_a_cancelled_batch_prints_one_stderr_line_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a batch that ends cancelled
    monkeypatch.setattr(BatchClient, "wait", lambda self, batch_id, **_: _finished("cancelled"))

    # When `wait --json` follows it
    code = cli.main(["wait", "batch_1", "--json", "--api-key", "k"])

    # Then stdout has the Batch object, stderr one line, and the exit code is 1
    out, err = capsys.readouterr()
    assert (code, json.loads(out)["status"]) == (1, "cancelled")
    assert err == "error: batch batch_1 was cancelled (1/3 done, 1 failed)\n"


def test_status_prints_the_summary_and_json_the_whole_object(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = _finished("completed", completed_at=1_700_000_065, metadata={"a": "b"})
    monkeypatch.setattr(BatchClient, "retrieve", lambda self, batch_id: batch)

    assert cli.main(["status", "batch_1", "--api-key", "k"]) == 0
    assert capsys.readouterr().out == (
        "batch_1: completed, /v1/chat/completions, 1/3 done, 1 failed\n"
        "created 2023-11-14 22:13:20 UTC, ended 2023-11-14 22:14:25 UTC\n"
    )
    assert cli.main(["status", "batch_1", "--api-key", "k", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == batch


def test_submit_without_endpoint_takes_the_files_url(tmp_path: Path) -> None:
    # Given a file of completions lines, one of them not JSON (the server reports it)
    path = tmp_path / "in.jsonl"
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}
    path.write_text(json.dumps(line) + "\n\nnot json\n" + json.dumps({**line, "custom_id": "b"}) + "\n")

    assert cli.build_parser().parse_args(["submit", str(path)]).endpoint is None
    assert file_endpoint(path) == "/v1/completions"


def test_a_file_without_urls_is_a_chat_batch(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("[1]\n")

    assert file_endpoint(path) == "/v1/chat/completions"


def test_a_file_mixing_urls_is_a_usage_error_naming_the_first_line_of_each(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(
            json.dumps({"custom_id": str(n), "method": "POST", "url": url, "body": {}}) + "\n"
            for n, url in enumerate(["/v1/responses", "/v1/responses", "/v1/chat/completions"])
        )
    )

    with pytest.raises(cli.CliError) as raised:
        file_endpoint(path)

    assert (str(raised.value), raised.value.code) == (
        f"error: {path} mixes urls: /v1/responses (line 1), /v1/chat/completions (line 3); a batch has one "
        "endpoint: split the file, or give --endpoint to have the other lines reported",
        2,
    )


def test_submit_with_the_anthropic_dialect_creates_a_message_batch_and_downloads_its_results(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    # Given a file of Message Batch requests and a batch that completes
    path = tmp_path / "requests.jsonl"
    request = {"custom_id": "a", "params": {"model": "m", "max_tokens": 1, "messages": []}}
    path.write_text(json.dumps(request) + "\n\n")
    sent: list[list[dict]] = []
    monkeypatch.setattr(
        BatchClient, "create_message_batch", lambda self, requests: sent.append(requests) or {"id": "batch_1"}
    )
    monkeypatch.setattr(BatchClient, "retrieve", lambda self, batch_id: _finished("in_progress"))
    monkeypatch.setattr(BatchClient, "wait", lambda self, batch_id, **_: _finished("completed"))
    monkeypatch.setattr(BatchClient, "message_batch_results", lambda self, batch_id: b'{"custom_id":"a"}\n')

    # When `submit --dialect anthropic --wait -o` runs it
    out = tmp_path / "out"
    code = cli.main(
        ["submit", str(path), "--dialect", "anthropic", "--wait", "-o", str(out), "--json", "--api-key", "k"]
    )

    # Then the requests went to /v1/messages/batches and its results are in results.jsonl
    assert (code, sent) == (0, [[request]])
    assert (out / "results.jsonl").read_bytes() == b'{"custom_id":"a"}\n'
    assert json.loads(capsys.readouterr().out)["status"] == "completed"


def test_a_message_batch_file_line_that_is_not_json_is_a_usage_error(tmp_path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text("{}\nnope\n")

    code = cli.main(["submit", str(path), "--dialect", "anthropic", "--api-key", "k"])

    assert code == 2
