"""The README's quick start, run as written: its commands in order, against the local stack they start.

The `## Quick start` section's bash block is parsed: the `make local` line starts the stack in the
background (on a free port: `PORT` is the Makefile's knob, `BATCHINFER_BASE_URL` points the CLI at
it; the commands themselves run unchanged), every other line runs in order in one bash with `set -e`
from the repository's root, as a user's second terminal would. The section's `openai` SDK example then
runs against the same stack, in the same terminal's environment, to the answers it prints. When the
README and the product disagree (a command, an option, a path, the key), a command fails and so does
this test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.user_stack import free_port, stop, wait_until_up

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def first_block(text: str, language: str) -> str:
    """The first ```language block of `text`."""
    found = re.search(rf"```{language}\n(.*?)```", text, re.S)
    assert found, f"no {language} block"
    return found.group(1)


def section(text: str, heading: str) -> str:
    """The text under `## heading`, up to the next `## `."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def commands(block: str) -> list[str]:
    """The block's commands: lines without their comments, blank lines dropped."""
    lines = [line.split(" #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    steps = commands(first_block(section(text, "Quick start"), "bash"))
    [start] = [step for step in steps if "make local" in step]
    rest = [step for step in steps if step != start]
    assert rest, "the quick start has no commands after starting the stack"
    results = ROOT / "results"
    assert not results.exists(), f"{results} exists: the quick start would not start from nothing"

    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("BATCHINFER_", "AWS_"))},
        "PORT": str(port),
        "BATCHINFER_LOCAL_STATE": str(tmp_path / "local.json"),  # not the user's own
    }
    log = (tmp_path / "stack.log").open("wb")  # a pipe nobody reads would fill and stop the stack
    stack = subprocess.Popen(
        ["bash", "-c", start], cwd=ROOT, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_until_up(base_url, stack)
        script = "set -euo pipefail\n" + "\n".join(rest)
        run = subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            env={**env, "BATCHINFER_BASE_URL": base_url},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
        assert (
            "API key (account 'default', from $BATCHINFER_DEV_API_KEY): local"
            in (tmp_path / "stack.log").read_text()
        )
        assert run.stderr == ""
        # The batch of the sample file completed, and its answers are where the README says
        assert re.search(r"batch batch_\w+: completed, 3/3 completed, 0 failed", run.stdout), run.stdout
        answers = [json.loads(line) for line in (results / "output.jsonl").read_text().splitlines()]
        assert [answer["custom_id"] for answer in answers] == ["hello-1", "hello-2", "hello-3"]

        # And the quick start's SDK example runs in the same terminal, to the answers it prints
        snippet = first_block(section(text, "Quick start"), "python runnable")
        sdk = subprocess.run(
            [sys.executable, "-c", snippet],
            cwd=ROOT,
            env={**env, "BATCHINFER_API_KEY": "local", "BATCHINFER_BASE_URL": base_url},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert (sdk.returncode, sdk.stderr) == (0, "")
        summary, *answers = sdk.stdout.splitlines()
        assert re.fullmatch(r"batch_\w+ completed 3 of 3", summary), sdk.stdout
        assert [answer.split(" ", 1)[0] for answer in answers] == ["hello-1", "hello-2", "hello-3"]
    finally:
        stop(stack)
        log.close()
        shutil.rmtree(results, ignore_errors=True)
