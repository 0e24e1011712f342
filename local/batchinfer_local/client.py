"""A small HTTP client of the Batch API (local stack or deployed stack alike)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

TERMINAL = {"completed", "failed", "expired", "cancelled"}


class BatchClient:
    """Calls `<base_url>/files` and `<base_url>/batches`; `base_url` ends in `/v1`.

    Raises `httpx.HTTPStatusError` on a 4xx/5xx, with the OpenAI error envelope as its response body.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, follow_redirects=True
        )

    def _json(self, response: httpx.Response) -> Any:
        response.raise_for_status()
        return response.json()

    def upload(self, path: Path) -> dict[str, Any]:
        with path.open("rb") as handle:
            return self._json(
                self.http.post(
                    "/files",
                    data={"purpose": "batch"},
                    files={"file": (path.name, handle, "application/jsonl")},
                )
            )

    def create(
        self,
        input_file_id: str,
        *,
        endpoint: str = "/v1/chat/completions",
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": completion_window,
        }
        if metadata:
            body["metadata"] = metadata
        return self._json(self.http.post("/batches", json=body))

    def retrieve(self, batch_id: str) -> dict[str, Any]:
        return self._json(self.http.get(f"/batches/{batch_id}"))

    def content(self, file_id: str) -> bytes:
        response = self.http.get(f"/files/{file_id}/content")
        response.raise_for_status()
        return response.content

    def wait(
        self,
        batch_id: str,
        *,
        poll_s: float = 1.0,
        timeout_s: float = 3600.0,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the batch is terminal; `on_update` sees every polled Batch object."""
        deadline = time.monotonic() + timeout_s
        while True:
            batch = self.retrieve(batch_id)
            if on_update:
                on_update(batch)
            if batch["status"] in TERMINAL:
                return batch
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} still {batch['status']} after {timeout_s:.0f} s")
            time.sleep(poll_s)
