"""Backend faults of the local stack's chaos mode (`batchinfer.core.chaos`): some requests fail with a
retryable 503 or answer slowly."""

from __future__ import annotations

import asyncio
from typing import Any

from batchinfer.backends.base import BackendError
from batchinfer.core import chaos


class ChaosBackend:
    """Wraps a backend: some requests fail with a retryable 503 or answer slowly."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        await self._faults()
        return await self.inner.chat_completion(body)

    async def _faults(self) -> None:
        if chaos.roll("slow_backend"):
            state = chaos.state()
            await asyncio.sleep(state[0].slow_backend_seconds if state else 0)
        if chaos.roll("backend_error"):
            raise BackendError(
                503, "injected backend fault", type="server_error", code="chaos", retryable=True
            )


def wrap(backend: Any) -> Any:
    """`backend` itself when chaos is off, else a `ChaosBackend` around it."""
    return backend if chaos.state() is None else ChaosBackend(backend)
