"""A scripted model for the moto-backed pipeline tests: `scripted-model` served by a loopback
`HoldableUpstream` through the registry's `openai` backend.

Every chat request is answered at once with `echo: <prompt>` and usage of 3 prompt + 2 completion
tokens (prompts holding `FAIL` get a 400, `HOLD` waits for `release()`): tests of the pipeline's
bookkeeping run the real worker and HTTP backend without loading the embedded model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from batchinfer.core.settings import get_settings
from support.api_stack import SCRIPTED, HoldableUpstream

__all__ = ["SCRIPTED", "scripted_model"]


@contextmanager
def scripted_model(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldableUpstream]:
    """Serve `scripted-model` (and no other model) from a new `HoldableUpstream` while the context lasts.

    Writes the registry to `directory/scripted-models.yaml` and points `MODEL_REGISTRY` at it (settings
    re-read): enter it after the moto account, whose set-up sets the functions' environment.
    """
    with HoldableUpstream() as upstream:
        registry = directory / "scripted-models.yaml"
        registry.write_text(
            f"models:\n  {SCRIPTED}:\n    backend: openai\n    base_url: {upstream.base_url}\n"
            "    model: scripted\n    timeout: 30\n"
        )
        monkeypatch.setenv("MODEL_REGISTRY", str(registry))
        get_settings.cache_clear()
        yield upstream
