"""`batchinfer buckets create` without a stack: the name must match the stack's pattern, --local is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchinfer_local import cli
from batchinfer_local.cli.buckets import matches_pattern
from batchinfer_local.cli.state import LocalState


@pytest.mark.parametrize(
    ("name", "pattern", "matches"),
    [
        ("batchinfer-user-acme", "batchinfer-user-*", True),
        ("batchinfer-user-", "batchinfer-user-*", True),
        ("acme", "batchinfer-user-*", False),
        ("x-batchinfer-user-acme", "batchinfer-user-*", False),
        ("team-a1", "team-??", True),
        ("team-a12", "team-??", False),
    ],
)
def test_names_match_the_iam_wildcard_pattern(name: str, pattern: str, matches: bool) -> None:
    assert matches_pattern(name, pattern) is matches


def test_without_local_it_says_to_add_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["buckets", "create", "batchinfer-user-acme"]) == 2
    assert capsys.readouterr().err == (
        "error: `buckets create` sets up a bucket on the local stack: add --local (on AWS, create the bucket "
        "yourself and allow it with `batchinfer accounts set ID --allow-bucket s3://NAME`)\n"
    )


def test_without_a_running_stack_it_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(cli.STATE_ENV, str(tmp_path / "local.json"))
    assert cli.main(["buckets", "create", "batchinfer-user-acme", "--local"]) == 1
    assert capsys.readouterr().err == (
        f"error: no local stack is running (no {tmp_path / 'local.json'}): start one with `make local`\n"
    )


def test_a_name_outside_the_user_bucket_pattern_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a running stack's state (its moto is never reached: the name is refused first)
    state = LocalState(
        base_url="http://127.0.0.1:1/v1",
        moto_endpoint="http://127.0.0.1:1",
        region="us-east-1",
        table="t",
        bucket="b",
        access_key_id="testing",
        secret_access_key="testing",
        user_bucket_pattern="team-*",
    )
    (tmp_path / "local.json").write_text(state.model_dump_json())
    monkeypatch.setenv(cli.STATE_ENV, str(tmp_path / "local.json"))

    assert cli.main(["buckets", "create", "batchinfer-user-acme", "--local"]) == 2
    assert capsys.readouterr().err == (
        "error: bucket 'batchinfer-user-acme' does not match the stack's user bucket pattern 'team-*' "
        "(template parameter UserBucketPattern): choose a name like 'team-mine'\n"
    )


def test_an_old_state_file_stands_for_the_default_pattern_and_dev_account() -> None:
    state = LocalState.model_validate(
        {
            "base_url": "u",
            "moto_endpoint": "m",
            "region": "us-east-1",
            "table": "t",
            "bucket": "b",
            "access_key_id": "testing",
            "secret_access_key": "testing",
        }
    )
    assert (state.user_bucket_pattern, state.dev_account) == ("batchinfer-user-*", "default")
