"""`GET /v1/batches/{batch_id}/output`: the output lines committed so far, while the batch runs
(`pipeline.partial`).

An extension of the OpenAI Batch API. The body is JSONL: output lines `after` + 1 ... in input order,
as far as they are complete, each byte-equal to its line in the final `output.jsonl`. Headers say
where to go on: `X-Batchinfer-Next-After` (the `after` of the next read), `X-Batchinfer-More` (`true`:
more lines are committed already, beyond this answer's size) and `X-Batchinfer-Complete` (`true`: the
batch has ended and this answer holds its last output lines).
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query

from batchinfer.api.batches import BatchId, owned_batch
from batchinfer.api.errors import documented
from batchinfer.pipeline import partial

router = Router()
JSONL = "application/jsonl"
OUTPUT_RESPONSES = documented(
    {"description": "output lines as JSONL", "content": {JSONL: {"schema": {"type": "string"}}}}, 404
)


def _flag(value: bool) -> str:
    return "true" if value else "false"


@router.get("/v1/batches/<batch_id>/output", responses=OUTPUT_RESPONSES)
def batch_output(
    batch_id: BatchId,
    after: Annotated[int, Query(ge=0, description="output lines already read: answer from the next")] = 0,
):
    """The batch's output lines committed so far, from line `after` + 1, in input order as far as
    complete (at most 4 MiB of them; the headers say how to go on)."""
    page = partial.read_output(owned_batch(batch_id), after)
    return Response(
        status_code=200,
        content_type=JSONL,
        body=page.data,
        headers={
            "X-Batchinfer-Next-After": str(page.after + page.lines),
            "X-Batchinfer-More": _flag(page.more),
            "X-Batchinfer-Complete": _flag(page.complete),
        },
    )
