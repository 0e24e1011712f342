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
from typing import Any, Literal

from pydantic import BaseModel

from batchinfer_local.client import ApiError, BatchClient, Unreachable

LINES = 4
DEFAULT_MODEL = "smollm2-135m-instruct"


class StepResult(BaseModel):
    """One step's outcome: `step` (its name above), `outcome`, `detail` (one line: what was seen)."""

    step: str
    outcome: Literal["PASS", "FAIL", "SKIP"]
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
    client = BatchClient(base_url, api_key)
    results: list[StepResult] = []
    state: dict[str, Any] = {}

    def step(name: str, needs: tuple[str, ...], run: Callable[[], str]) -> None:
        if any(key not in state for key in needs):
            result = StepResult(step=name, outcome="SKIP", detail=f"needs {', '.join(needs)}")
        else:
            try:
                result = StepResult(step=name, outcome="PASS", detail=run())
            except AssertionError as error:
                result = StepResult(step=name, outcome="FAIL", detail=str(error))
            except ApiError as error:
                code = f", {error.code}" if error.code else ""
                result = StepResult(
                    step=name, outcome="FAIL", detail=f"{error.message} (HTTP {error.status}{code})"
                )
            except (Unreachable, TimeoutError) as error:
                result = StepResult(step=name, outcome="FAIL", detail=str(error))
        results.append(result)
        if report:
            report(result)

    def models() -> str:
        listed = [m["id"] for m in client.request("GET", "/models").json()["data"]]
        state["model"] = model or (listed[0] if listed else DEFAULT_MODEL)
        assert state["model"] in listed, f"{state['model']} is not among the models {listed}"
        return f"{len(listed)} model(s); batch model {state['model']}"

    def upload() -> str:
        data = batch_file(state["model"])
        uploaded = client.request(
            "POST",
            "/files",
            data={"purpose": "batch"},
            files={"file": ("smoke.jsonl", data, "application/jsonl")},
        ).json()
        assert uploaded["bytes"] == len(data), f"{uploaded['bytes']} bytes stored of {len(data)}"
        state["file"] = uploaded["id"]
        return f"{uploaded['id']} ({len(data)} bytes)"

    def create() -> str:
        batch = client.create(state["file"], metadata={"smoke": "1"})
        assert batch["status"] == "validating", f"status {batch['status']}, not validating"
        state["batch"] = batch["id"]
        return batch["id"]

    def progress() -> str:
        seen: list[int] = []
        started = time.monotonic()

        def record(batch: dict[str, Any]) -> None:
            done = batch["request_counts"]["completed"] + batch["request_counts"]["failed"]
            if not seen or seen[-1] != done:
                seen.append(done)

        batch = client.wait(state["batch"], poll_s=poll_s, timeout_s=timeout_s, on_update=record)
        assert seen == sorted(seen), f"counts went down: {seen}"
        counts = batch["request_counts"]
        assert batch["status"] == "completed", f"ended {batch['status']}: {batch.get('errors')}"
        assert counts == {"total": LINES, "completed": LINES, "failed": 0}, f"counts {counts}"
        state["done"] = batch
        return f"completed in {time.monotonic() - started:.1f} s; done counts seen {seen}"

    def download() -> str:
        batch = state["done"]
        lines = [json.loads(line) for line in client.content(batch["output_file_id"]).splitlines()]
        ids = [line["custom_id"] for line in lines]
        assert ids == [f"smoke-{n}" for n in range(LINES)], f"custom_ids {ids}"
        statuses = {line["response"]["status_code"] for line in lines}
        assert statuses == {200}, f"status codes {statuses}"
        return f"{len(lines)} answers in input order"

    def cancel() -> str:
        batch = client.create(state["file"], metadata={"smoke": "cancel"})
        try:
            client.cancel(batch["id"])
        except ApiError as error:
            if error.status != 409:  # it may have finished already
                raise
        ended = client.wait(batch["id"], poll_s=poll_s, timeout_s=timeout_s)
        assert ended["status"] in ("cancelled", "completed"), f"{batch['id']} ended {ended['status']}"
        return f"{batch['id']} {ended['status']}"

    def token() -> str:
        root = base_url.rstrip("/").removesuffix("/v1")
        body = {
            "id": "smoke",
            "inputs": [{"name": "input0", "shape": [1, 3], "datatype": "UINT32", "data": [396, 319, 13]}],
            "outputs": [{"name": "output0"}],
            "parameters": {"max_new_tokens": 3, "do_sample": False},
        }
        answer = client.request("POST", f"{root}/v2/models/{state['model']}/infer", json=body).json()
        data = answer["outputs"][0]["data"]
        assert answer["id"] == "smoke" and 0 < len(data) <= 3, f"answer {answer}"
        return f"{len(data)} token(s) generated"

    def cross_account() -> str:
        other = BatchClient(base_url, second_api_key)
        for path in (f"/batches/{state['batch']}", f"/files/{state['file']}"):
            try:
                other.request("GET", path)
            except ApiError as error:
                assert error.status == 404, f"GET {path} with the second key: HTTP {error.status}"
            else:
                raise AssertionError(f"GET {path} with the second key answered 200")
        return "the first account's batch and file are 404 to the second"

    step("models", (), models)
    step("upload", ("model",), upload)
    step("create", ("file",), create)
    step("progress", ("batch",), progress)
    step("download", ("done",), download)
    step("cancel", ("file",), cancel)
    step("token", ("model",), token)
    if second_api_key:
        step("cross-account", ("batch",), cross_account)
    else:
        results.append(StepResult(step="cross-account", outcome="SKIP", detail="no --second-api-key given"))
        if report:
            report(results[-1])
    return results
