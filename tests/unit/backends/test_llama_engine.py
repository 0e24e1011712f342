"""What the engine sets before llama.cpp loads (`batchinfer.backends.llama_engine`)."""

from __future__ import annotations

import os

import pytest

from batchinfer.backends import llama_engine


def test_openmp_threads_sleep_at_barriers_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    llama_engine._sleep_at_barriers()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"

    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    llama_engine._sleep_at_barriers()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
