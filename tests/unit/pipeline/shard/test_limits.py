"""The per-process limiter of each backend and the concurrency ceiling."""

from typing import Any

from batchinfer.pipeline.shard.limits import INITIAL_CONCURRENCY, concurrency_for, limiter_for


class ScriptedBackend:
    """A backend stand-in: these rules look at a backend's identity and `concurrency_hint` only."""

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("not called")


def test_an_in_process_engine_gets_its_concurrency_hint_never_above_the_ceiling() -> None:
    from batchinfer.backends.chaos import ChaosBackend
    from batchinfer.infer.service import TokenRequests

    engine = ScriptedBackend()
    engine.concurrency_hint = 20  # type: ignore[attr-defined]

    assert concurrency_for(engine, 64) == 20
    assert concurrency_for(engine, 8) == 8  # WORKER_CONCURRENCY still caps it
    assert concurrency_for(ScriptedBackend(), 64) == 64  # a remote backend: found below 64
    # Token batches and chaos mode wrap the backend; the hint passes through both.
    assert concurrency_for(ChaosBackend(TokenRequests(engine)), 64) == 20
    assert concurrency_for(TokenRequests(ScriptedBackend()), 64) == 64


def test_one_limiter_per_backend_recapped_by_a_new_maximum_and_fixed_for_an_engine() -> None:
    remote, engine = ScriptedBackend(), ScriptedBackend()
    engine.concurrency_hint = 20  # type: ignore[attr-defined]

    limiter = limiter_for(remote, 512)
    assert (limiter.limit, limiter.maximum, limiter.control.latency) == (
        INITIAL_CONCURRENCY,
        512,
        True,
    )
    assert limiter_for(remote, 40) is limiter  # a share bound re-caps what was learned
    assert (limiter.limit, limiter.maximum) == (40, 40)
    fixed = limiter_for(engine, 20)  # an engine's latency grows with its batch: no latency rules
    assert (fixed.limit, fixed.control.latency) == (20, False)
