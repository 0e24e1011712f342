"""The `batchinfer` CLI against the local stack: its commands, and each failure as one line with an exit code.

Runs `cli.main` in this process (the stack's HTTP API on a free port, the real embedded model) and
reads what it prints; every failure must be exactly one line on stderr, never a traceback.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchinfer.data import uploads
from batchinfer_local import LocalStack, cli
from batchinfer_local import client as client_module
from batchinfer_local.cli.common import date as cli_date
from support.api_stack import chat_line, jsonl, new_account
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(300), DEFAULT.mark]

USER_BUCKET = "batchinfer-user-cli"


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("cli")) as shared:
        running = shared.stack
        running.s3.create_bucket(Bucket=USER_BUCKET)
        running.s3.put_object(Bucket=USER_BUCKET, Key="in/b.jsonl", Body=jsonl(chat_line("t-1", "Say hi.")))
        yield running


@pytest.fixture(scope="module")
def account_key(stack: LocalStack) -> str:
    """The module's own account on the shared stack (its `list` shows only this module's batches)."""
    return new_account("cli")


@pytest.fixture
def run(stack: LocalStack, account_key: str, capsys: pytest.CaptureFixture[str]):
    """`run(*args, key=...)`: (exit code, stdout, stderr) of `batchinfer ARGS --base-url U --api-key K`."""

    def call(*args: str, key: str | None = None) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main([*args, "--base-url", f"{stack.base_url}/v1", "--api-key", key or account_key])
        out, err = capsys.readouterr()
        return code, out, err

    return call


@pytest.fixture
def batch_file(tmp_path: Path) -> Path:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(jsonl(chat_line("c-1", "Say one."), chat_line("c-2", "Say two.")))
    return path


def test_a_wrong_key_is_the_servers_message_the_status_and_what_to_do(run) -> None:
    code, out, err = run("list", key="sk-bi-wrong-key-0000")
    assert (code, out) == (1, "")
    assert err == (
        "error: Incorrect API key provided: sk-bi-...0000. (HTTP 401, invalid_api_key): "
        "set BATCHINFER_API_KEY or pass --api-key (`batchinfer local` prints the local stack's key)\n"
    )


def test_an_unknown_batch_is_one_line_and_exit_1(run) -> None:
    code, out, err = run("status", "batch_nope")
    assert (code, out) == (1, "")
    assert err == (
        "error: No batch found with id 'batch_nope'. (HTTP 404, batch_not_found): check the id: "
        "`batchinfer list` shows your batches\n"
    )


def test_submit_wait_downloads_and_the_batch_shows_in_list_and_files(
    run, batch_file: Path, tmp_path: Path
) -> None:
    # When a file is submitted with --wait and -o, the options after the command
    code, out, err = run(
        "submit", str(batch_file), "--wait", "-o", str(tmp_path / "out"), "--metadata", "suite=cli", "--json"
    )

    # Then the last stdout line is the completed Batch, and both answers are downloaded
    assert (code, err) == (0, "")
    batch = json.loads(out.splitlines()[-1])
    assert (batch["status"], batch["request_counts"]) == (
        "completed",
        {"total": 2, "completed": 2, "failed": 0},
    )
    assert batch["metadata"] == {"suite": "cli"}
    lines = [json.loads(line) for line in (tmp_path / "out" / "output.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["c-1", "c-2"]
    assert not (tmp_path / "out" / "error.jsonl").exists()

    # And `list` and `files list` show them
    code, out, _ = run("list", "--json")
    assert code == 0 and json.loads(out)["data"][0]["id"] == batch["id"]
    code, out, _ = run("files", "list", "--json")
    assert {batch["input_file_id"], batch["output_file_id"]} <= {f["id"] for f in json.loads(out)["data"]}
    # (as text: one line per item, the newest first)
    code, out, _ = run("list")
    assert (code, out.splitlines()[0].split("  created ")[0]) == (
        0,
        f"{batch['id']}  completed   2/2 done, 0 failed",
    )
    code, out, _ = run("files", "list", "--purpose", "batch_output")
    output = next(
        f for f in json.loads(run("files", "list", "--json")[1])["data"] if f["id"] == batch["output_file_id"]
    )
    assert (code, out.splitlines()[0].split("  created ")[0]) == (
        0,
        f"{batch['output_file_id']}  batch_output  {output['bytes']:>10} bytes",
    )
    code, out, _ = run("list", key=new_account("cli-empty"))
    assert (code, out) == (0, "no batches yet: `batchinfer submit FILE` creates one\n")

    # And `wait ID` of a finished batch returns at once, exit 0, nothing on stderr
    code, out, err = run("wait", batch["id"], "--json")
    assert (code, json.loads(out)["status"], err) == (0, "completed", "")

    # And `status ID` is a short summary; with --json the whole Batch object
    code, out, err = run("status", batch["id"])
    assert (code, err) == (0, "")
    assert out == (
        f"{batch['id']}: completed, /v1/chat/completions, 2/2 done, 0 failed\n"
        f"created {cli_date(batch['created_at'])}, ended {cli_date(batch['completed_at'])}\n"
    )
    code, out, _ = run("status", batch["id"], "--json")
    assert (code, json.loads(out)["id"], json.loads(out)["request_counts"]) == (
        0,
        batch["id"],
        batch["request_counts"],
    )

    # And `files delete` deletes the input; a second delete is one line, 404
    code, out, _ = run("files", "delete", batch["input_file_id"], "--json")
    assert (code, json.loads(out)) == (0, {"id": batch["input_file_id"], "object": "file", "deleted": True})
    code, out, err = run("files", "delete", batch["input_file_id"])
    assert (code, out) == (1, "")
    assert err == (
        f"error: No such File object: {batch['input_file_id']} (HTTP 404, file_not_found): check the id: "
        "`batchinfer files list` shows your files\n"
    )

    # And cancelling the finished batch is the server's 409, one line
    code, out, err = run("cancel", batch["id"])
    assert (code, out) == (1, "")
    assert err.startswith("error: ") and "(HTTP 409, " in err and err.count("\n") == 1


def test_submit_text_output_ends_with_a_summary_line(run, batch_file: Path) -> None:
    code, out, err = run("submit", str(batch_file), "--wait", "--completion-window", "2h")
    assert (code, err) == (0, "")
    summary = out.splitlines()[-1]
    assert (
        summary.startswith("batch batch_")
        and ": completed, 2/2 completed, 0 failed; output_file_id=file-" in summary
    )


def test_cancel_of_a_fresh_batch_and_of_a_finished_one(run, stack: LocalStack, batch_file: Path) -> None:
    code, out, _ = run("submit", str(batch_file), "--json")
    batch = json.loads(out)
    code, out, err = run("cancel", batch["id"], "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["status"] in ("cancelling", "cancelled")
    code, out, err = run("wait", batch["id"], "--json")
    assert (code, json.loads(out)["status"]) == (1, "cancelled")  # not completed: exit 1
    # and one line on stderr: how it ended, with its counts (none yet when the cancel came while it was
    # validating: the lines were never counted, as OpenAI's batches cancelled then show)
    assert re.fullmatch(
        rf"error: batch {batch['id']} was cancelled \((0/0|[0-2]/2) done, [0-2] failed\)\n", err
    )
    code, out, err = run("cancel", batch["id"])  # again: the same batch, as OpenAI answers
    assert (code, err, out) == (0, "", f"batch {batch['id']}: cancelled\n")


def test_a_file_over_the_single_request_limit_goes_through_the_uploads_api(
    run, stack: LocalStack, batch_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "SINGLE_REQUEST_BYTES", 100)
    code, out, err = run("submit", str(batch_file), "--json")
    assert (code, err) == (0, "")
    batch = json.loads(out)
    # The file id is the upload's (upload_X made file-X): it came through POST /v1/uploads
    upload = uploads.get("upload_" + batch["input_file_id"].removeprefix("file-"))
    assert upload is not None
    assert (upload.status, upload.bytes) == ("completed", batch_file.stat().st_size)


def test_download_of_a_failed_batch_says_so_and_exits_1(run, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(jsonl(chat_line("x-1", "hi", model="no-such-model")))
    code, out, err = run("submit", str(path), "--wait", "--json")
    batch = json.loads(out.splitlines()[-1])
    assert (code, batch["status"]) == (1, "failed")
    code, out, err = run("download", batch["id"], "-o", str(tmp_path / "out"))
    assert code == 1
    assert err.startswith(
        f"error: batch {batch['id']} failed: model_not_found: Line 1: model 'no-such-model'"
    )
    assert err.endswith(f"(`batchinfer status {batch['id']}` shows all)\n") and err.count("\n") == 1


def test_download_of_a_tokenhub_batch_uses_its_presigned_url(run, stack: LocalStack, tmp_path: Path) -> None:
    key = new_account("cli-th", allowed_buckets=[f"s3://{USER_BUCKET}"])
    from batchinfer_local.client import BatchClient

    client = BatchClient(f"{stack.base_url}/v1", key)
    created = client._json(
        "POST",
        "/batches",
        json={
            "input_source": "user_s3",
            "input_file_id": f"s3://{USER_BUCKET}/in/b.jsonl",
            "output_target": "user_s3",
            "output_user_s3_path": f"s3://{USER_BUCKET}/out/",
        },
    )
    done = client.wait(created["id"], poll_s=0.5, timeout_s=120)
    assert done["output_file_id"].startswith("s3://")
    code, out, err = run("download", created["id"], "-o", str(tmp_path / "th"), key=key)
    assert (code, err) == (0, "")
    assert out == f"wrote {tmp_path / 'th' / 'output.jsonl'} (1 lines)\n"
    [line] = (tmp_path / "th" / "output.jsonl").read_text().splitlines()
    assert json.loads(line)["custom_id"] == "t-1"


def test_keys_and_accounts_on_the_local_stack_need_no_aws_credentials(
    stack: LocalStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state = tmp_path / "local.json"
    cli.write_state(stack, state)
    monkeypatch.setenv(cli.STATE_ENV, str(state))
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    capsys.readouterr()
    assert cli.main(["keys", "create", "--account", "cli-local", "--local", "--json"]) == 0
    created: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert created["account_id"] == "cli-local" and created["key"].startswith("sk-bi-")
    assert cli.main(["keys", "list", "--account", "cli-local", "--local"]) == 0
    [listed] = capsys.readouterr().out.splitlines()
    assert listed.startswith(f"{created['key_id']}  created 20") and " UTC  active  " in listed
    assert cli.main(["accounts", "show", "cli-local", "--local", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["account_id"] == "cli-local"
    # A webhook URL: its signing secret is printed once, then never shown again
    url = "https://hooks.example.com/hooks"  # registration refuses private and loopback hosts
    assert cli.main(["accounts", "set", "cli-local", "--webhook-url", url, "--local", "--json"]) == 0
    configured = json.loads(capsys.readouterr().out)
    assert configured["webhook_url"] == url and configured["webhook_secret"].startswith("whsec_")
    assert len(base64.b64decode(configured["webhook_secret"].removeprefix("whsec_"))) == 32
    assert cli.main(["accounts", "show", "cli-local", "--local", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["webhook_url"] == url and "webhook_secret" not in shown
    # A rotation prints the new secret once; the old one's grace is shown, never the old secret
    rotate = ["accounts", "set", "cli-local", "--rotate-webhook-secret", "--webhook-grace", "60"]
    assert cli.main([*rotate, "--max-storage-bytes", "1000", "--local", "--json"]) == 0
    rotated = json.loads(capsys.readouterr().out)
    assert (
        rotated["webhook_secret"].startswith("whsec_")
        and rotated["webhook_secret"] != configured["webhook_secret"]
    )
    assert rotated["webhook_previous_until"] >= time.time() + 50 and "webhook_previous_secret" not in rotated
    assert rotated["max_storage_bytes"] == 1000
    assert cli.main(["accounts", "set", "cli-local", "--webhook-url", "", "--local"]) == 0
    out = capsys.readouterr().out
    assert '"webhook_url": null' in out and "whsec_" not in out


def test_buckets_create_sets_up_a_tokenhub_bucket_in_one_step(
    stack: LocalStack,
    run,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    state = tmp_path / "local.json"
    cli.write_state(stack, state)
    monkeypatch.setenv(cli.STATE_ENV, str(state))
    capsys.readouterr()

    # When a bucket is created for the dev key's account (the default)
    assert cli.main(["buckets", "create", "batchinfer-user-cli-dev", "--local"]) == 0

    # Then it exists in the stack's S3 and is on the account's allowlist
    assert capsys.readouterr().out == (
        f"bucket s3://batchinfer-user-cli-dev created in the local stack's S3 ({stack.moto_endpoint})\n"
        "account 'default' may use it: allowed buckets s3://batchinfer-user-cli-dev\n"
    )
    stack.s3.head_bucket(Bucket="batchinfer-user-cli-dev")

    # And a TokenHub batch of the dev key reads and writes it
    stack.s3.put_object(
        Bucket="batchinfer-user-cli-dev", Key="in/b.jsonl", Body=jsonl(chat_line("d-1", "Say hi."))
    )
    from batchinfer_local.client import BatchClient

    client = BatchClient(f"{stack.base_url}/v1", stack.api_key)
    created = client._json(
        "POST",
        "/batches",
        json={
            "input_source": "user_s3",
            "input_file_id": "s3://batchinfer-user-cli-dev/in/b.jsonl",
            "output_target": "user_s3",
            "output_user_s3_path": "s3://batchinfer-user-cli-dev/out/",
        },
    )
    assert client.wait(created["id"], poll_s=0.5, timeout_s=120)["status"] == "completed"

    # And again, for another account: the bucket is kept, the other account's allowlist grows
    assert (
        cli.main(["buckets", "create", "batchinfer-user-cli-dev", "--local", "--account", "cli-bk", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out) == {
        "bucket": "batchinfer-user-cli-dev",
        "created": False,
        "account_id": "cli-bk",
        "allowed_buckets": ["s3://batchinfer-user-cli-dev"],
    }

    # And a name outside UserBucketPattern is refused, nothing created
    assert cli.main(["buckets", "create", "my-bucket", "--local"]) == 2
    assert capsys.readouterr().err == (
        "error: bucket 'my-bucket' does not match the stack's user bucket pattern 'batchinfer-user-*' "
        "(template parameter UserBucketPattern): choose a name like 'batchinfer-user-mine'\n"
    )
    assert "my-bucket" not in {b["Name"] for b in stack.s3.list_buckets()["Buckets"]}
