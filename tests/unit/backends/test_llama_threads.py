"""What the engine sets before llama.cpp loads (`batchinfer.backends.llama_threads`)."""

from __future__ import annotations

import pytest

from batchinfer.backends import llama_threads


def test_openmp_threads_spin_briefly_at_barriers_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert llama_threads.barrier_wait_environ() == {"GOMP_SPINCOUNT": "2000"}

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert llama_threads.barrier_wait_environ() == {}
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")
    assert llama_threads.barrier_wait_environ() == {}
