"""A batch through the real functions' code, in this process, against moto (a server process):
upload, create, prepare, every shard's worker, and the aggregator, with an instant model."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ANSWER = (
    "The sky looks blue at noon because air molecules scatter short blue wavelengths of sunlight "
    "much more than long red ones (Rayleigh scattering), so blue light reaches the eye from every "
    "direction of the sky. "
) * 4


class InstantBackend:
    """A model that answers at once with a realistic completion (~1 KB of text, usage counted)."""

    _ids = itertools.count()

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "logprobs": None,
                    "message": {"role": "assistant", "content": ANSWER, "refusal": None},
                }
            ],
            "usage": {"prompt_tokens": 40, "completion_tokens": 220, "total_tokens": 260},
        }


class _Registry:
    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def backend(self, name: str) -> Any:
        return self._backend

    def __contains__(self, name: str) -> bool:
        return True


@contextmanager
def instant_model() -> Iterator[None]:
    """Make every model name of the registry answer with `InstantBackend` (prepare and worker)."""
    from batchinfer.pipeline import prepare
    from batchinfer.pipeline.shard import worker

    registry = _Registry(InstantBackend())
    saved = worker.load_registry, prepare.load_registry
    worker.load_registry = prepare.load_registry = lambda path=None: registry  # type: ignore[assignment]
    try:
        yield
    finally:
        worker.load_registry, prepare.load_registry = saved


def request_line(i: int) -> bytes:
    return (
        json.dumps(
            {
                "custom_id": f"request-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "smollm2-135m-instruct",
                    "max_tokens": 300,
                    "messages": [{"role": "user", "content": f"{i}: why is the sky blue?"}],
                },
            }
        ).encode()
        + b"\n"
    )


def run_shards(n: int) -> str:
    """Upload an `n`-request file, create its batch, prepare it and run every shard to the end.

    Returns the batch id; the batch is `in_progress` with all shards done (ready to aggregate).
    """
    from batchinfer.core import ids
    from batchinfer.core.settings import get_settings
    from batchinfer.data import shards, sqs
    from batchinfer.data.s3 import upload_stream
    from batchinfer.pipeline import intake
    from batchinfer.pipeline.prepare import prepare_batch
    from batchinfer.pipeline.shard import worker

    bucket = get_settings().bucket_name
    key = f"files/pipeline-{n}-{time.time_ns()}"
    upload_stream(bucket, key, (request_line(i) for i in range(n)))
    batch_id = ids.new_batch_id()
    intake.create_batch(
        batch_id=batch_id,
        account_id="default",
        input_file_id=f"file-{n}",
        input_bucket=bucket,
        input_key=key,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    assert prepare_batch(batch_id) == "in_progress"
    for shard in list(shards.query(batch_id)):
        outcome = worker.process_shard(
            sqs.ShardMessage(batch_id=batch_id, shard=shard.shard),
            owner=f"bench/{shard.shard}",
            time_left_ms=lambda: 900_000,
        )
        assert outcome == "done", outcome
    return batch_id
