"""The retry policy's waits."""

import pytest

from batchinfer.backends.base import BackendError
from batchinfer.pipeline.shard import retry


def test_an_overload_retry_waits_at_most_a_second_and_never_its_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    monkeypatch.setattr(retry, "BACKOFF_BASE_S", 0.0)
    monkeypatch.setattr(retry, "OVERLOADED_BACKOFF_BASE_S", 0.05)
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: high)  # the longest wait drawn
    refused = BackendError(429, "busy", retryable=True)  # `Limited` took its Retry-After for the limiter
    other = BackendError(500, "oops", retryable=True, retry_after=3.0)

    def wait(error: BackendError, attempt: int) -> float:
        state = SimpleNamespace(outcome=SimpleNamespace(exception=lambda: error), attempt_number=attempt)
        return retry._wait(state)  # type: ignore[arg-type]

    assert [wait(refused, n) for n in (1, 2, 3, 6, 19)] == [0.0, 0.05, 0.1, 0.8, 1.0]
    assert wait(other, 1) == 3.0  # another error's Retry-After is still honoured
