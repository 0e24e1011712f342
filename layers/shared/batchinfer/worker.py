"""The shard worker: run a shard's requests on the model backend and commit them exactly once.

A shard message may arrive twice (SQS is at-least-once), concurrently or after the shard is done.
One message at a time holds the shard's lease (`store.claim_shard`); results go to a deterministic
key with one PUT; `store.commit_shard` counts them in one transaction guarded by the shard's
`next_index`, so repeated work never counts twice. Near the Lambda time limit the worker stops
launching requests, commits what finished and enqueues a continuation for the rest.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from batchinfer import ids, queues, storage, store
from batchinfer.backends import load_registry
from batchinfer.backends.base import BackendError, ChatBackend
from batchinfer.observability import logger
from batchinfer.schemas import result_line
from batchinfer.settings import get_settings
from batchinfer.status import BatchStatus

MAX_ATTEMPTS = 4
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.5, 20.0
# One loop per process: backends may keep connection pools bound to it across invocations.
_LOOP = asyncio.new_event_loop()


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a shard: its input `line` (1-based), `custom_id` and OpenAI request `body`."""

    line: int
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request ended in: a status code and a response body (a completion or an error envelope)."""

    request: Request
    status_code: int
    body: dict[str, Any]
    request_id: str

    @property
    def ok(self) -> bool:
        return self.status_code < 400


def parse_shard(data: bytes) -> list[Request]:
    """Requests of a shard file: lines `<line>\\t<request JSON>` written by prepare."""
    requests = []
    for raw in data.split(b"\n"):
        if not raw:
            continue
        number, _, line = raw.partition(b"\t")
        obj = json.loads(line)
        requests.append(Request(int(number), obj["custom_id"], obj["body"]))
    return requests


def _wait(state: Any) -> float:
    """Capped exponential backoff with full jitter, never shorter than the backend's Retry-After."""
    error = state.outcome.exception()
    backoff = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (state.attempt_number - 1)))
    retry_after = getattr(error, "retry_after", None) or 0.0
    return max(backoff, min(retry_after, BACKOFF_CAP_S))


async def call_backend(backend: ChatBackend, body: dict[str, Any]) -> dict[str, Any]:
    """One request with retries of retryable `BackendError`s (429, 5xx, timeouts); re-raises the last."""
    # A string that can't be UTF-8 encoded (lone surrogate) can't be sent to any model.
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise BackendError(400, f"request body is not valid Unicode: {error.reason} at position {error.start}",
                           code="invalid_encoding") from None
    async for attempt in AsyncRetrying(
            stop=stop_after_attempt(MAX_ATTEMPTS), wait=_wait, reraise=True,
            retry=retry_if_exception(lambda e: isinstance(e, BackendError) and e.retryable)):
        with attempt:
            return await backend.chat_completion(body)
    raise AssertionError("unreachable")


async def run_requests(backend: ChatBackend, requests: list[Request], batch_id: str, *, concurrency: int,
                       time_left_ms: Callable[[], int], reserve_ms: int) -> list[Outcome]:
    """Run requests with at most `concurrency` in flight, in order of launch.

    Stops launching when `time_left_ms()` drops under `reserve_ms`; every launched request finishes,
    so the outcomes are those of a prefix of `requests`, in input order.
    """
    slots = asyncio.Semaphore(concurrency)
    outcomes: list[Outcome | None] = [None] * len(requests)

    async def one(index: int, request: Request) -> None:
        request_id = ids.request_id(batch_id, request.line)
        try:
            body = await call_backend(backend, request.body)
            outcomes[index] = Outcome(request, 200, body, body.get("id") or request_id)
        except BackendError as error:
            outcomes[index] = Outcome(request, error.status_code, error.body(), request_id)
        except Exception as error:  # a backend bug must cost one line, not the shard
            logger.exception("backend raised", extra={"custom_id": request.custom_id})
            outcomes[index] = Outcome(request, 500, BackendError(500, f"backend error: {error}",
                                                                 type="server_error").body(), request_id)
        finally:
            slots.release()

    tasks = []
    for index, request in enumerate(requests):
        await slots.acquire()
        if time_left_ms() < reserve_ms:
            slots.release()
            break
        tasks.append(asyncio.create_task(one(index, request)))
    await asyncio.gather(*tasks)
    return [o for o in outcomes[: len(tasks)] if o is not None]


def render(batch_id: str, outcomes: list[Outcome]) -> tuple[bytes, int, dict[str, int]]:
    """Result lines: successes first, then failures, each in input order.

    Returns (bytes, length of the success part, counts `{completed, failed, input_tokens, output_tokens}`).
    """
    good, bad = bytearray(), bytearray()
    counts = {"completed": 0, "failed": 0, "input_tokens": 0, "output_tokens": 0}
    for outcome in outcomes:
        line = result_line(line_id=ids.request_id(batch_id, outcome.request.line),
                           custom_id=outcome.request.custom_id, status_code=outcome.status_code,
                           request_id=outcome.request_id, body=outcome.body)
        encoded = json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        if outcome.ok:
            good += encoded
            usage = outcome.body.get("usage") or {}
            counts["completed"] += 1
            counts["input_tokens"] += int(usage.get("prompt_tokens") or 0)
            counts["output_tokens"] += int(usage.get("completion_tokens") or 0)
        else:
            bad += encoded
            counts["failed"] += 1
    return bytes(good + bad), len(good), counts


def process_shard(message: queues.ShardMessage, *, owner: str, time_left_ms: Callable[[], int]) -> str:
    """Run (the rest of) one shard. Returns what happened, for logs and tests:

    `done` (shard finished), `continued` (time ran short: a continuation was enqueued), `duplicate`
    (done already or leased by another message), `stopped` (batch not running), `conflict` (the
    commit's condition failed: another attempt counted this work).
    """
    settings = get_settings()
    batch_id, shard_no = message.batch_id, message.shard
    header = store.get_batch(batch_id)
    if header is None or header["status"] != BatchStatus.IN_PROGRESS or header.get("sealed"):
        return "stopped"
    lease_seconds = time_left_ms() // 1000 + 60
    shard = store.claim_shard(batch_id, shard_no, owner=owner, lease_seconds=lease_seconds)
    if shard is None:
        return "duplicate"
    start, size = shard["next_index"], shard["size"]
    requests = parse_shard(storage.get_bytes(settings.bucket_name, shard["input_key"]))[start:]
    backend = load_registry(settings.model_registry).backend(header["model"])
    outcomes = _LOOP.run_until_complete(run_requests(
        backend, requests, batch_id, concurrency=settings.worker_concurrency, time_left_ms=time_left_ms,
        reserve_ms=settings.time_reserve_ms))
    end = start + len(outcomes)
    if not outcomes:
        store.release_shard(batch_id, shard_no, owner=owner)
        queues.send(settings.shards_queue_url, [message])
        return "continued"
    data, output_bytes, counts = render(batch_id, outcomes)
    key = storage.result_key(batch_id, shard_no, start)
    storage.put_bytes(settings.bucket_name, key, data)
    part = {"key": key, "start": start, "end": end, "output_bytes": output_bytes, "bytes": len(data)}
    if not store.commit_shard(batch_id, shard_no, start=start, end=end, size=size, part=part, **counts):
        logger.info("shard commit condition failed: counted by another attempt",
                    extra={"batch_id": batch_id, "shard": shard_no})
        return "conflict"
    if end < size:
        queues.send(settings.shards_queue_url, [message])
        return "continued"
    after = store.get_batch(batch_id)
    if after and after["shards_done"] >= after["shards_total"]:
        queues.send(settings.finalize_queue_url, [queues.BatchMessage(batch_id=batch_id)])
    return "done"
