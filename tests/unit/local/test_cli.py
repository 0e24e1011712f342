"""The CLI without a stack: options before or after the command, one-line errors, the progress rates."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest

from batchinfer_local import cli
from batchinfer_local.client import ApiError


def test_global_options_are_accepted_before_and_after_the_command() -> None:
    parser = cli.build_parser()
    before = parser.parse_args(["--api-key", "K", "--base-url", "http://h/v1", "--json", "status", "b1"])
    after = parser.parse_args(["status", "b1", "--api-key", "K", "--base-url", "http://h/v1", "--json"])
    nested = parser.parse_args(["files", "list", "--api-key", "K", "--json"])
    assert (before.api_key, before.base_url, before.json, before.batch_id) == ("K", "http://h/v1", True, "b1")
    assert (after.api_key, after.base_url, after.json, after.batch_id) == ("K", "http://h/v1", True, "b1")
    assert (nested.api_key, nested.json, nested.action) == ("K", True, "list")


def test_an_option_before_the_command_is_not_overwritten_by_the_commands_default() -> None:
    args = cli.build_parser().parse_args(["--api-key", "K", "list"])
    assert args.api_key == "K"
    assert args.json is False


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
    assert cli._metadata(args.metadata) == {"a": "1", "b": "x=y"}


def test_metadata_without_an_equals_sign_is_a_usage_error() -> None:
    with pytest.raises(cli.CliError) as raised:
        cli._metadata(["nope"])
    assert (str(raised.value), raised.value.code) == ("error: --metadata 'nope' is not KEY=VALUE", 2)


def _error(status: int, body: object) -> ApiError:
    request = httpx.Request("GET", "http://h/v1/batches/b")
    return ApiError.of(httpx.Response(status, json=body, request=request))


def test_api_errors_read_the_envelope_and_end_in_what_to_do() -> None:
    unauthorized = _error(
        401,
        {
            "error": {
                "message": "Incorrect API key provided.",
                "type": "x",
                "param": None,
                "code": "invalid_api_key",
            }
        },
    )
    missing = _error(
        404, {"error": {"message": "No such batch: b", "code": "batch_not_found", "param": "batch_id"}}
    )
    gateway = _error(413, {"message": "Request Entity Too Large"})
    kserve = _error(400, {"error": "inputs[0].shape: must be [1, n]"})
    assert cli.describe_api_error(unauthorized) == (
        "error: Incorrect API key provided. (HTTP 401, invalid_api_key): set BATCHINFER_API_KEY or pass "
        "--api-key (`batchinfer local` prints the local stack's key)"
    )
    assert cli.describe_api_error(missing) == (
        "error: No such batch: b (HTTP 404, batch_not_found): check the id: "
        "`batchinfer list` shows your batches"
    )
    assert cli.describe_api_error(gateway) == (
        "error: Request Entity Too Large (HTTP 413): send files over 6 MB through /v1/uploads "
        "(`batchinfer submit` does so by itself)"
    )
    assert cli.describe_api_error(kserve) == "error: inputs[0].shape: must be [1, n] (HTTP 400)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_stack_that_is_not_running_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    code = cli.main(["list", "--base-url", f"http://127.0.0.1:{port}/v1", "--api-key", "k"])
    err = capsys.readouterr().err
    assert code == 1
    assert err == (
        f"error: cannot reach http://127.0.0.1:{port}/v1 (ConnectError: [Errno 111] Connection refused): "
        "start the local stack (`make local`) or point --base-url / BATCHINFER_BASE_URL at a deployed "
        "stack's ApiUrl followed by v1\n"
    )


def test_a_missing_file_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    code = cli.main(["submit", str(tmp_path / "nope.jsonl"), "--api-key", "k"])
    assert code == 2
    assert (
        capsys.readouterr().err
        == f"error: no such file: {tmp_path / 'nope.jsonl'}: give the path of a JSONL batch file\n"
    )


def test_a_port_in_use_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["local", "--port", str(port)])
    assert code == 1
    assert logging.getLogger("batchinfer_local.function").handlers == []  # the log handler went too
    assert capsys.readouterr().err == (
        f"error: port {port} is already in use: stop what listens there, or choose another port "
        "(`batchinfer local --port N`, `make local PORT=N`)\n"
    )


def test_keys_without_a_table_say_how_to_name_one(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.delenv("BATCHINFER_TABLE", raising=False)
    code = cli.main(["keys", "list", "--account", "a"])
    assert code == 2
    assert capsys.readouterr().err == (
        "error: name the batch table with --table (or $BATCHINFER_TABLE) or --stack-name, or use --local "
        "for the running local stack\n"
    )


def test_keys_local_without_a_running_stack_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv(cli.STATE_ENV, str(tmp_path / "local.json"))
    code = cli.main(["keys", "list", "--account", "a", "--local"])
    assert code == 1
    assert capsys.readouterr().err == (
        f"error: no local stack is running (no {tmp_path / 'local.json'}): start one with `make local`\n"
    )


def _batch(status: str, done: int, failed: int = 0, tokens: int = 0, total: int = 20) -> dict:
    return {
        "status": status,
        "request_counts": {"total": total, "completed": done, "failed": failed},
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": tokens},
    }


def test_rates_start_at_in_progress_and_give_requests_tokens_and_eta() -> None:
    rates = cli.Rates()
    assert rates.update(_batch("validating", 0), now=100.0) == {"rps": "-", "tps": "-", "eta": "-"}
    assert rates.update(_batch("in_progress", 0), now=102.0) == {"rps": "-", "tps": "-", "eta": "-"}
    assert rates.update(_batch("in_progress", 0), now=103.0) == {"rps": "-", "tps": "-", "eta": "-"}
    # 8 requests (1 failed) and 400 tokens in 4 s since in_progress: 2 req/s, 100 tok/s, 12 left: 6 s
    assert rates.update(_batch("in_progress", 7, 1, 400), now=106.0) == {
        "rps": "2.0",
        "tps": "100.0",
        "eta": "0:06",
    }
    # ETA in minutes past 60 s
    assert rates.update(_batch("in_progress", 9, 1, 500, total=1000), now=112.0) == {
        "rps": "1.0",
        "tps": "50.0",
        "eta": "16:30",
    }


def test_rates_sum_input_and_output_tokens_when_total_is_absent() -> None:
    batch = {"status": "in_progress", "request_counts": {"total": 4, "completed": 2, "failed": 0}}
    rates = cli.Rates()
    rates.update({**batch, "request_counts": {"total": 4, "completed": 0, "failed": 0}}, now=0.0)
    assert rates.update({**batch, "usage": {"input_tokens": 30, "output_tokens": 10}}, now=2.0) == {
        "rps": "1.0",
        "tps": "20.0",
        "eta": "0:02",
    }


def test_function_log_lines_are_labelled_with_their_function(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    functions = logging.getLogger("batchinfer_local.function")
    before = functions.handlers[:]
    with cli._show_function_logs(logging.INFO):
        logging.getLogger("batchinfer_local.function.ShardWorkerFunction").warning("a plain line")
        logging.getLogger("batchinfer_local.function.ApiFunction").info('{"level": "INFO"}')
        logging.getLogger("batchinfer_local.function.ApiFunction").debug("below the level")
    assert functions.handlers == before  # nothing left behind
    assert capsys.readouterr().out == '[ShardWorkerFunction] a plain line\n[ApiFunction] {"level": "INFO"}\n'
