"""The batch status machine: one pure table, used by every conditional status write.

Statuses and meanings follow the OpenAI Batch API
(https://platform.openai.com/docs/api-reference/batch/object).
"""

from __future__ import annotations

from enum import StrEnum


class BatchStatus(StrEnum):
    """OpenAI batch statuses."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


S = BatchStatus
_TRANSITIONS: dict[BatchStatus, frozenset[BatchStatus]] = {
    S.VALIDATING: frozenset({S.IN_PROGRESS, S.FAILED, S.CANCELLING, S.EXPIRED}),
    S.IN_PROGRESS: frozenset({S.FINALIZING, S.CANCELLING}),
    S.FINALIZING: frozenset({S.COMPLETED, S.EXPIRED, S.FAILED}),
    S.CANCELLING: frozenset({S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.EXPIRED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
TERMINAL: frozenset[BatchStatus] = frozenset(s for s, nxt in _TRANSITIONS.items() if not nxt)

# The Unix-seconds field a status stamps when the batch enters it.
TIMESTAMP_FIELD: dict[BatchStatus, str] = {
    S.VALIDATING: "created_at",
    S.IN_PROGRESS: "in_progress_at",
    S.FINALIZING: "finalizing_at",
    S.COMPLETED: "completed_at",
    S.FAILED: "failed_at",
    S.EXPIRED: "expired_at",
    S.CANCELLING: "cancelling_at",
    S.CANCELLED: "cancelled_at",
}


def allowed_sources(target: BatchStatus) -> frozenset[BatchStatus]:
    """Statuses from which `target` may be entered (the condition of its DynamoDB write)."""
    return frozenset(src for src, nxt in _TRANSITIONS.items() if target in nxt)


def can_transition(source: BatchStatus, target: BatchStatus) -> bool:
    """True when `source -> target` is an edge of the status machine."""
    return target in _TRANSITIONS[source]


def is_terminal(status: BatchStatus) -> bool:
    """True for completed, failed, expired and cancelled."""
    return status in TERMINAL
