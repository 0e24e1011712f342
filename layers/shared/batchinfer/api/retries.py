"""`POST /v1/batches/{batch_id}/retry`: a new batch from an ended batch's failed lines (`pipeline.rerun`).

An extension of the OpenAI Batch API: the answer is the retry's Batch object, whose
`metadata.retry_of` names the original; calling it again returns the same batch.
"""

from __future__ import annotations

from aws_lambda_powertools.event_handler.api_gateway import Router

from batchinfer.api import links
from batchinfer.api.auth import current_account
from batchinfer.api.batches import BatchId, batch_view, limit_refused, owned_batch
from batchinfer.api.errors import Conflict, documented, stored_despite
from batchinfer.core import ids
from batchinfer.data import accounts, batches
from batchinfer.pipeline import rerun
from batchinfer.wire.openai import Batch

router = Router()


@router.post(
    "/v1/batches/<batch_id>/retry", responses=documented(None, 404, 409, 429, links=links.BATCH_RESULTS)
)
def retry_batch(batch_id: BatchId) -> Batch:
    """Create a batch from the lines of an ended batch that failed or never ran (same endpoint, window
    and metadata, plus `metadata.retry_of`); a repeated call returns the batch the first one created.
    409 for a batch still running, one that failed validation, or one without a failed line."""
    header = owned_batch(batch_id)
    account_id = current_account()
    limits = accounts.batch_limits(accounts.get_account(account_id))
    try:
        created = rerun.retry_batch(
            header, max_active=limits.max_active, max_per_minute=limits.max_per_minute
        )
    except rerun.NotRetryable as error:
        raise Conflict(str(error), code=error.code, param="batch_id") from None
    except accounts.LimitExceeded as error:
        raise limit_refused(error) from None
    except Exception as error:  # AWS unavailable: a 503 unless the retry was in fact stored
        retry_id = ids.retry_batch_id(batch_id)
        created = stored_despite(error, lambda: batches.get(retry_id))
    return batch_view(created)
