"""`batchinfer smoke` against the local stack: every step passes and prints one line."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from batchinfer_local import LocalStack, cli
from support.api_stack import new_account
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(300), DEFAULT.mark]


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("smoke")) as shared:
        yield shared.stack


STEPS = ["models", "upload", "create", "progress", "download", "cancel", "token", "cross-account"]


def test_smoke_passes_on_the_local_stack_with_one_line_per_step(
    stack: LocalStack, capsys: pytest.CaptureFixture[str]
) -> None:
    # An account of its own: the stack is shared, and its default account's batch creations per minute
    # are spent by the other modules' tests.
    first, other = new_account("smoke"), new_account("smoke-other")
    capsys.readouterr()
    code = cli.main(
        ["smoke", "--base-url", f"{stack.base_url}/v1", "--api-key", first, "--second-api-key", other]
    )
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert (code, err) == (0, ""), out
    assert [line.split()[:2] for line in lines] == [["PASS", step] for step in STEPS]
    assert lines[0] == "PASS models         2 model(s); batch model smollm2-135m-instruct"
    assert re.fullmatch(r"PASS upload         file-[0-9a-f]{24} \(\d+ bytes\)", lines[1])
    assert re.fullmatch(r"PASS progress       completed in [\d.]+ s; done counts seen \[.*4\]", lines[3])
    assert lines[4] == "PASS download       4 answers in input order"
    assert re.fullmatch(r"PASS cancel         batch_\w+ (cancelled|completed)", lines[5])
    assert lines[6] == "PASS token          3 token(s) generated"
    assert lines[7] == "PASS cross-account  the first account's batch and file are 404 to the second"


def test_smoke_fails_with_a_wrong_key_and_skips_what_depends_on_it(
    stack: LocalStack, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = cli.main(["smoke", "--base-url", f"{stack.base_url}/v1", "--api-key", "sk-bi-wrong-key-0000"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert lines[0] == (
        "FAIL models         Incorrect API key provided: sk-bi-...0000. (HTTP 401, invalid_api_key)"
    )
    assert [line.split()[:2] for line in lines[1:]] == [
        ["SKIP", "upload"],
        ["SKIP", "create"],
        ["SKIP", "progress"],
        ["SKIP", "download"],
        ["SKIP", "cancel"],
        ["SKIP", "token"],
        ["SKIP", "cross-account"],
    ]
