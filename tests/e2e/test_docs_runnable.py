"""The runnable examples of README.md and docs/, run as written against one local stack.

A block marked ```` ```bash runnable ```` or ```` ```python runnable ```` (docs/README.md) runs on its
own from the repository's root, with what the quick start leaves a user with: the stack started by
`batchinfer local` with the dev key `local`, `BATCHINFER_API_KEY` exported. The test's stack listens on
a free port and keeps its state file in a temporary directory: `BATCHINFER_BASE_URL` and
`BATCHINFER_LOCAL_STATE` say where, as a user's environment may. A block passes when it exits 0; the
examples that show a result also print what they must (`EXPECTED`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.markdown import ROOT, Block, blocks, documents
from support.user_stack import free_port, stop, wait_until_up

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]

RUNNABLE = [block for path in documents() for block in blocks(path) if block.runnable]
KEY = "local"
# (file, a phrase of the block, what its output must match): the examples' results.
ANSWERS = r"hello-1: .*\nhello-2: .*\nhello-3: .*\n"
EXPECTED = [
    ("README.md", "client.files.content", r"batch_\w+ completed 3 of 3\n" + ANSWERS.replace(":", "")),
    ("api.md", "batches?limit=3", r"(?s)batch_\w+ completed .*\n" + ANSWERS),
    ("api.md", '/cancel"', r'cancelling\n\{.*"total":22.*\}\n'),
    ("api.md", "upload_file_chunked", r"completed file-\w+ \d+\n"),
    ("api.md", "part_ids", r'\{"status":"completed","file":"file-\w+","bytes":\d+\}\n'),
    ("api.md", "--upload-file", r'\{"status":"completed","file":"file-\w+"\}\n'),
    ("api.md", "user_s3", r"completed\ns3://batchinfer-user-demo/results/batch_\w+/output.jsonl\nhello-1\n"),
    ("api.md", "tokenizer.detokenize", r"\d+ tokens in, [1-9]\d* tokens out\n.+"),
    ("api.md", "[396, 319, 13]", r'\[\{"name":"output0","shape":\[1,[1-9]\d*\],"datatype":"UINT32"'),
    (
        "api.md",
        "messages.batches.create",
        r"(?s)batch_\w+ 2 succeeded\nhello-1 succeeded.*\nhello-2 succeeded",
    ),
    ("deploy.md", "smoke", r"PASS +models"),
    ("local-stack.md", "download", ANSWERS + "$"),
    ("local-stack.md", "cancel", r"wait exited with 1\n$"),
    ("operations.md", "keys revoke", r"the revoked key is refused\n$"),
]


def expected_output(block: Block) -> str | None:
    """The pattern `block`'s output must match, if `EXPECTED` names it."""
    found = [
        pattern for name, phrase, pattern in EXPECTED if block.path.name == name and phrase in block.code
    ]
    assert len(found) <= 1, f"{block.name}: {len(found)} entries of EXPECTED match it"
    return found[0] if found else None


def start_stack(port: int, state: Path, log: Path) -> subprocess.Popen[bytes]:
    """`batchinfer local` on `port` with the dev key, its state file at `state`, output to `log`."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("BATCHINFER_", "AWS_"))},
        "BATCHINFER_DEV_API_KEY": KEY,
        "BATCHINFER_LOCAL_STATE": str(state),
    }
    with log.open("wb") as out:  # a pipe nobody reads would fill and stop the stack
        return subprocess.Popen(
            [str(Path(sys.executable).with_name("batchinfer")), "local", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture(scope="module")
def user_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A user's environment after the quick start, with its stack running."""
    home, port = tmp_path_factory.mktemp("docs-stack"), free_port()
    state, base_url = home / "local.json", f"http://127.0.0.1:{port}/v1"
    stack = start_stack(port, state, home / "stack.log")
    try:
        wait_until_up(base_url, stack, ready=state.exists)
        yield {
            **{k: v for k, v in os.environ.items() if not k.startswith(("BATCHINFER_", "AWS_"))},
            "BATCHINFER_API_KEY": KEY,
            "BATCHINFER_BASE_URL": base_url,
            "BATCHINFER_LOCAL_STATE": str(state),
        }
    finally:
        stop(stack)


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: block.name)
def test_the_example_runs_as_written(block: Block, user_env: dict[str, str], tmp_path: Path) -> None:
    # Given the block as the page shows it
    if block.language == "python":
        script = tmp_path / "example.py"
        script.write_text(block.code)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-c", "set -euo pipefail\n" + block.code]

    # When it runs from the repository's root, in the user's environment
    run = subprocess.run(command, cwd=ROOT, env=user_env, capture_output=True, text=True, timeout=600)

    # Then it succeeds, and shows the result it promises
    assert run.returncode == 0, (
        f"{block.name} exited {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    )
    if (pattern := expected_output(block)) is not None:
        assert re.search(pattern, run.stdout), f"{block.name}: {pattern!r} not in its output:\n{run.stdout}"
