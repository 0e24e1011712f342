"""The pipeline under injected faults (chaos mode of the local stack), fixed seeds, real model.

Each scenario runs a batch through the HTTP API with one kind of fault at a high rate (and one with
all of them), then checks the invariant: every input line in exactly one result file, counts
exact, terminal status, timestamps in order. The faults are configured in the functions' own
environments (`configure_functions`) and counted there (`stats`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchinfer_local import LocalStack
from batchinfer_local.client import BatchClient
from support.invariant import assert_batch_invariant

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

LINES = 24
# Short leases and stuck timers so crashed work is picked up again within seconds. The lease still
# outlives a shard's run (on AWS it is the invocation's remaining time + 60 s): the shards run at once,
# and a worker whose lease expired under it would share its shard with the next holder, their result
# parts overwriting each other.
FAST_RECOVERY = {
    "SHARD_LEASE_SECONDS": "20",
    "STUCK_AFTER_SECONDS": "3",
    "CHECKPOINT_SECONDS": "0.2",
    # Giving up on a shard has its own test; here every line must get its real answer.
    "MAX_SHARD_ATTEMPTS": "50",
    "WORKER_CONCURRENCY": "4",
}


# What caches the variables changed here, in each function's environments.
RESETS = ["batchinfer.core.settings.get_settings.cache_clear", "batchinfer.core.chaos.reset"]


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(
        port=0,
        schedule_interval=1.0,
        parameter_overrides={"ShardSize": "4"},
        function_environment=FAST_RECOVERY,
    ) as running:
        yield running


def batch_text(tag: str) -> str:
    return "".join(
        json.dumps(
            {
                "custom_id": f"{tag}-{i:03d}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "smollm2-135m-instruct",
                    "max_tokens": 2,
                    "temperature": 0,
                    "messages": [{"role": "user", "content": f"Count to {i}."}],
                },
            }
        )
        + "\n"
        for i in range(LINES)
    )


SCENARIOS = {
    "crash_before_commit": {"crash_before_commit": 0.3},
    "crash_after_commit": {"crash_after_commit": 0.3},
    "duplicate_delivery": {"duplicate_delivery": 0.5},
    "backend_error": {"backend_error": 0.3},
    "slow_backend": {"slow_backend": 0.3, "slow_backend_seconds": 0.3},
    "crash_in_aggregator": {"crash_in_aggregator": 0.5},
    "everything": {
        "crash_before_commit": 0.2,
        "crash_after_commit": 0.2,
        "duplicate_delivery": 0.2,
        "backend_error": 0.2,
        "slow_backend": 0.2,
        "crash_in_aggregator": 0.2,
    },
}
# With this seed the first draw of every fault's stream is below 0.16: each fault fires at its first chance.
SEED = 1440


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_invariant_holds_under(stack: LocalStack, scenario: str, tmp_path: Path) -> None:
    stack.wait_idle(300)  # nothing of the previous scenario still runs (an invocation keeps its variables)
    stack.configure_functions(
        {"BATCHINFER_CHAOS": json.dumps({"seed": SEED, **SCENARIOS[scenario]})}, call=RESETS
    )
    stack.reset_stats()
    try:
        client = BatchClient(f"{stack.base_url}/v1", stack.api_key)
        path = tmp_path / "in.jsonl"
        path.write_text(batch_text(scenario))
        batch = client.wait(client.create(client.upload(path)["id"])["id"], poll_s=0.5, timeout_s=300)
        fired = {
            name.removeprefix("chaos:"): count
            for name, count in stack.stats().items()
            if name.startswith("chaos:")
        }
    finally:
        stack.configure_functions(unset=["BATCHINFER_CHAOS"], call=RESETS)
    output = client.content(batch["output_file_id"]) if batch["output_file_id"] else None
    errors = client.content(batch["error_file_id"]) if batch["error_file_id"] else None
    assert batch["status"] == "completed"
    faults = {name for name in SCENARIOS[scenario] if not name.endswith("_seconds")}
    assert {name for name, count in fired.items() if count} == faults  # every fault of the scenario happened
    assert_batch_invariant(batch, path.read_text(), output, errors)
    if scenario not in ("backend_error", "everything"):
        assert batch["request_counts"]["failed"] == 0, errors[:600]
