"""The CLI's parser and `main` without a stack: options before or after the command, one-line errors."""

from __future__ import annotations

import logging
import socket

import pytest

from batchinfer_local import cli


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


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--webhook-grace", "10"], "error: --webhook-grace goes with --rotate-webhook-secret\n"),
        (
            ["--rotate-webhook-secret", "--webhook-url", "https://hooks.example.com/h"],
            "error: --webhook-url sets a new secret of its own; rotate with --rotate-webhook-secret alone\n",
        ),
    ],
)
def test_webhook_flags_that_would_not_do_what_they_say_are_refused_before_any_table(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHINFER_TABLE", raising=False)
    assert cli.main(["accounts", "set", "acme", *flags]) == 2
    assert capsys.readouterr().err == message
