"""No API key ever reaches a log.

Requests carrying keys (the right one, wrong ones, keys in other headers, keys without `Bearer`) go
through the local stack, and a whole batch runs, while every log record is captured: the functions'
logs (their Powertools Logger's JSON lines at DEBUG and anything else they write, in their own
processes, forwarded line by line to the loggers `batchinfer_local.function.<LogicalId>`), every
other logger of this process at DEBUG (the local stack, botocore; the Powertools Logger's stream
too), and the stdout and stderr of this process and of the functions' processes.
`POWERTOOLS_LOGGER_LOG_EVENT=true` is set as an operator debugging the functions would set it:
the API function's event holds the Authorization header, and must still not be logged.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import httpx
import pytest

from batchinfer.core.observability import logger as powertools_logger
from support.api_stack import (
    MODEL,
    SCRIPTED,
    api_client,
    chat_line,
    create,
    jsonl,
    new_account,
    result_lines,
    stack_with_upstream,
    upload,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)

DEV_KEY = "sk-bi-dev-secret-0123456789abcdefghijklmnopqrstu"
WRONG_KEY = "sk-bi-wrong-secret-9876543210zyxwvutsrqponmlkjih"


class Capture:
    """Everything logged while it is open: `powertools` (the handlers' JSON lines) and `records`."""

    def __init__(self) -> None:
        self.powertools = io.StringIO()
        self.records = io.StringIO()

    @property
    def text(self) -> str:
        return self.powertools.getvalue() + self.records.getvalue()


@pytest.fixture
def capture() -> Iterator[Capture]:
    captured = Capture()
    handler = powertools_logger.registered_handler
    level = powertools_logger.log_level
    stream = handler.setStream(captured.powertools)
    powertools_logger.setLevel("DEBUG")
    everything = logging.StreamHandler(captured.records)
    everything.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root_level = root.level
    root.addHandler(everything)
    root.setLevel(logging.DEBUG)
    try:
        yield captured
    finally:
        root.removeHandler(everything)
        root.setLevel(root_level)
        powertools_logger.setLevel(level)
        handler.setStream(stream)


def test_keys_are_never_logged(
    capture: Capture,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("BATCHINFER_DEV_API_KEY", DEV_KEY)
    monkeypatch.setenv("POWERTOOLS_LOGGER_LOG_EVENT", "true")
    # A stack of its own, started here: the logs it reads begin at the start (the dev key stored, every
    # function's init) and the dev key is this test's.
    with stack_with_upstream(
        tmp_path_factory.mktemp("secrets"),
        function_environment={"POWERTOOLS_LOG_LEVEL": "DEBUG", "AWS_LAMBDA_LOG_LEVEL": "DEBUG"},
    ) as (stack, _):
        assert stack.api_key == DEV_KEY
        key = new_account("secrets")
        others = {"X-Api-Key": key, "api-key": key, "OpenAI-Organization": DEV_KEY}
        with api_client(stack, key) as http:
            http.headers.update(others)
            data = jsonl(chat_line("a", "hello", model=SCRIPTED), chat_line("b", "FAIL", model=SCRIPTED))
            batch = wait_for(http, create(http, upload(http, data)).json()["id"], timeout=60)
            assert (batch["status"], batch["request_counts"]) == (
                "completed",
                {"total": 2, "completed": 1, "failed": 1},
            )
            assert [line["custom_id"] for line in result_lines(http, batch["output_file_id"])] == ["a"]
            assert http.get("/batches").status_code == 200
            assert (
                http.post(
                    "/batches", content="[" * 10_000, headers={"Content-Type": "application/json"}
                ).status_code
                == 400
            )
        for authorization, status in [
            (f"Bearer {WRONG_KEY}", 401),
            (WRONG_KEY, 401),
            (key, 401),
            (f"Basic {DEV_KEY}", 401),
            (f"Bearer {DEV_KEY}", 200),
        ]:
            response = httpx.get(f"{stack.base_url}/v1/batches", headers={"Authorization": authorization})
            assert response.status_code == status
        response = httpx.post(
            f"{stack.base_url}/v1/batches",
            content="{",
            headers={"Authorization": f"Bearer {WRONG_KEY}", "Content-Type": "application/json"},
        )
        assert response.status_code == 401
        infer = httpx.post(
            f"{stack.base_url}/v2/models/{MODEL}/infer",
            content="{",
            headers={"Authorization": f"Bearer {key}"},
        )
        assert infer.status_code == 400
        stack.wait_idle()
    out, err = capfd.readouterr()

    # The capture saw the functions work: the pipeline's JSON lines (DEBUG ones too), the gateway's requests.
    assert 'batchinfer_local.function.AggregatorFunction INFO {"level":"INFO"' in capture.records.getvalue()
    assert '"message":"finalized"' in capture.records.getvalue()
    assert "batchinfer_local.function.ApiFunction DEBUG [DEBUG]\t" in capture.records.getvalue()  # botocore
    assert "batchinfer_local.http DEBUG GET /v1/batches -> 401" in capture.records.getvalue()
    for secret in (DEV_KEY, key, WRONG_KEY):
        for where, text in (("logs", capture.text), ("stdout", out), ("stderr", err)):
            assert secret not in text, f"{secret[:10]}... in the {where}"
