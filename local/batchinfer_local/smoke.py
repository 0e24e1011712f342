"""`batchinfer smoke`: the whole user flow against a stack (deployed or local), one result per step.

Steps, in order (a step whose inputs failed is SKIP):

    models         GET /v1/models names the model the batch uses
    upload         POST /v1/files of a small JSONL file (`LINES` requests)
    create         POST /v1/batches: `validating`, request_counts of the input
    progress       GET until terminal: `completed`, counts that never go down and end exact
    download       the output file has one answer per request, in input order
    cancel         a second batch, cancelled at once, ends `cancelled` (or already `completed`)
    token          POST /v2/models/{model}/infer answers token ids (KServe v2)
    cross-account  with a second account's key the first batch and file are 404 (SKIP without one)

Only the HTTP API is used (httpx through `BatchClient`), so it runs wherever the stack's URL answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from batchinfer.wire.openai import CHAT_ENDPOINT
from batchinfer.wire.status import BatchStatus
from batchinfer_local.client import ApiError, BatchClient, Unreachable

LINES = 4
DEFAULT_MODEL = "smollm2-135m-instruct"


class Outcome(StrEnum):
    """How a step ended: PASS, FAIL, or SKIP (a step it needs failed)."""

    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


class StepResult(BaseModel):
    """One step's outcome: `step` (its name above), `outcome`, `detail` (one line: what was seen)."""

    step: str
    outcome: Outcome
    detail: str


def batch_file(model: str, lines: int = LINES) -> bytes:
    """`lines` tiny chat requests (4 tokens each at most, greedy), custom_ids smoke-0..."""
    return "".join(
        json.dumps(
            {
                "custom_id": f"smoke-{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": model,
                    "max_tokens": 4,
                    "temperature": 0,
                    "messages": [{"role": "user", "content": f"Say the number {n}."}],
                },
            }
        )
        + "\n"
        for n in range(lines)
    ).encode()


def run_smoke(
    base_url: str,
    api_key: str | None,
    *,
    second_api_key: str | None = None,
    model: str | None = None,
    timeout_s: float = 120.0,
    poll_s: float = 0.5,
    report: Callable[[StepResult], None] | None = None,
) -> list[StepResult]:
    """Run every step against `base_url` (ending in /v1); the results in step order.

    `report` sees each result as soon as it is known. Never raises for an API failure: that step is
    FAIL with the server's message and status.
    """
    run = SmokeRun(base_url, api_key, second_api_key, model, timeout_s, poll_s, report)
    run.step("models", (), run.models)
    run.step("upload", ("model",), run.upload)
    run.step("create", ("file",), run.create)
    run.step("progress", ("batch",), run.progress)
    run.step("download", ("done",), run.download)
    run.step("cancel", ("file",), run.cancel)
    run.step("token", ("model",), run.token)
    if second_api_key:
        run.step("cross-account", ("batch",), run.cross_account)
    else:
        run.record(StepResult(step="cross-account", outcome=Outcome.SKIP, detail="no --second-api-key given"))
    return run.results


class SmokeRun:
    """The steps of one smoke run; each step method returns its PASS detail or raises (see `step`).

    `state` holds what steps hand on (`model`, `file`, `batch`, `done`); a step whose inputs are
    missing is SKIP.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        second_api_key: str | None,
        model: str | None,
        timeout_s: float,
        poll_s: float,
        report: Callable[[StepResult], None] | None,
    ) -> None:
        self.base_url, self.second_api_key, self.model = base_url, second_api_key, model
        self.timeout_s, self.poll_s, self.report = timeout_s, poll_s, report
        self.client = BatchClient(base_url, api_key)
        self.results: list[StepResult] = []
        self.state: dict[str, Any] = {}

    def record(self, result: StepResult) -> None:
        """Keep `result` and report it."""
        self.results.append(result)
        if self.report:
            self.report(result)

    def step(self, name: str, needs: tuple[str, ...], run: Callable[[], str]) -> None:
        """Run one step: SKIP without its inputs, FAIL on a failed assertion, an API error, no answer or
        a timeout, else PASS with what `run` returns."""
        if any(key not in self.state for key in needs):
            result = StepResult(step=name, outcome=Outcome.SKIP, detail=f"needs {', '.join(needs)}")
        else:
            try:
                result = StepResult(step=name, outcome=Outcome.PASS, detail=run())
            except AssertionError as error:
                result = StepResult(step=name, outcome=Outcome.FAIL, detail=str(error))
            except ApiError as error:
                code = f", {error.code}" if error.code else ""
                result = StepResult(
                    step=name, outcome=Outcome.FAIL, detail=f"{error.message} (HTTP {error.status}{code})"
                )
            except (Unreachable, TimeoutError) as error:
                result = StepResult(step=name, outcome=Outcome.FAIL, detail=str(error))
        self.record(result)

    def models(self) -> str:
        models = self.client.request("GET", "/models").json()["data"]
        listed = [m["id"] for m in models]
        chat = [m["id"] for m in models if CHAT_ENDPOINT in m.get("endpoints", [CHAT_ENDPOINT])]
        self.state["model"] = self.model or (chat or listed or [DEFAULT_MODEL])[0]
        assert self.state["model"] in listed, f"{self.state['model']} is not among the models {listed}"
        return f"{len(listed)} model(s); batch model {self.state['model']}"

    def upload(self) -> str:
        data = batch_file(self.state["model"])
        uploaded = self.client.request(
            "POST",
            "/files",
            data={"purpose": "batch"},
            files={"file": ("smoke.jsonl", data, "application/jsonl")},
        ).json()
        assert uploaded["bytes"] == len(data), f"{uploaded['bytes']} bytes stored of {len(data)}"
        self.state["file"] = uploaded["id"]
        return f"{uploaded['id']} ({len(data)} bytes)"

    def create(self) -> str:
        batch = self.client.create(self.state["file"], metadata={"smoke": "1"})
        assert batch["status"] == BatchStatus.VALIDATING, f"status {batch['status']}, not validating"
        self.state["batch"] = batch["id"]
        return batch["id"]

    def progress(self) -> str:
        seen: list[int] = []
        started = time.monotonic()

        def record(batch: dict[str, Any]) -> None:
            done = batch["request_counts"]["completed"] + batch["request_counts"]["failed"]
            if not seen or seen[-1] != done:
                seen.append(done)

        batch = self.client.wait(
            self.state["batch"], poll_s=self.poll_s, timeout_s=self.timeout_s, on_update=record
        )
        assert seen == sorted(seen), f"counts went down: {seen}"
        counts = batch["request_counts"]
        assert batch["status"] == BatchStatus.COMPLETED, f"ended {batch['status']}: {batch.get('errors')}"
        assert counts == {"total": LINES, "completed": LINES, "failed": 0}, f"counts {counts}"
        self.state["done"] = batch
        return f"completed in {time.monotonic() - started:.1f} s; done counts seen {seen}"

    def download(self) -> str:
        batch = self.state["done"]
        lines = [json.loads(line) for line in self.client.content(batch["output_file_id"]).splitlines()]
        ids = [line["custom_id"] for line in lines]
        assert ids == [f"smoke-{n}" for n in range(LINES)], f"custom_ids {ids}"
        statuses = {line["response"]["status_code"] for line in lines}
        assert statuses == {200}, f"status codes {statuses}"
        return f"{len(lines)} answers in input order"

    def cancel(self) -> str:
        batch = self.client.create(self.state["file"], metadata={"smoke": "cancel"})
        try:
            self.client.cancel(batch["id"])
        except ApiError as error:
            if error.status != 409:  # it may have finished already
                raise
        ended = self.client.wait(batch["id"], poll_s=self.poll_s, timeout_s=self.timeout_s)
        assert ended["status"] in (BatchStatus.CANCELLED, BatchStatus.COMPLETED), (
            f"{batch['id']} ended {ended['status']}"
        )
        return f"{batch['id']} {ended['status']}"

    def token(self) -> str:
        root = self.base_url.rstrip("/").removesuffix("/v1")
        body = {
            "id": "smoke",
            "inputs": [{"name": "input0", "shape": [1, 3], "datatype": "UINT32", "data": [396, 319, 13]}],
            "outputs": [{"name": "output0"}],
            "parameters": {"max_new_tokens": 3, "do_sample": False},
        }
        url = f"{root}/v2/models/{self.state['model']}/infer"
        answer = self.client.request("POST", url, json=body).json()
        data = answer["outputs"][0]["data"]
        assert answer["id"] == "smoke" and 0 < len(data) <= 3, f"answer {answer}"
        return f"{len(data)} token(s) generated"

    def cross_account(self) -> str:
        other = BatchClient(self.base_url, self.second_api_key)
        for path in (f"/batches/{self.state['batch']}", f"/files/{self.state['file']}"):
            try:
                other.request("GET", path)
            except ApiError as error:
                assert error.status == 404, f"GET {path} with the second key: HTTP {error.status}"
            else:
                raise AssertionError(f"GET {path} with the second key answered 200")
        return "the first account's batch and file are 404 to the second"
