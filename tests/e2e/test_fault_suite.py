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
from typing import Any

import pytest
from anthropic import Anthropic

from batchinfer_local import LocalStack
from batchinfer_local.client import BatchClient
from support.invariant import assert_batch_invariant
from support.live import AnswerLog, assert_counts_monotonic, watch
from support.stacks import SharedStacks, StackConfig

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

LINES = 24
# A cancelled batch is larger: a fast machine answers 24 two-token requests between two GETs, and the
# cancel then finds the batch ended (409). What never ran ends at once, so the size costs little.
CANCEL_LINES = 96
# Short leases and stuck timers so crashed work is picked up again within seconds: a worker renews its
# 6 s lease every 2 s while it works (`worker.LeaseHeartbeat`), however long a shard's first window
# takes with six workers loading the model at once, and a crashed worker's shard is free 6 s after its
# last beat.
FAST_RECOVERY = {
    "SHARD_LEASE_SECONDS": "6",
    "STUCK_AFTER_SECONDS": "3",
    "CHECKPOINT_SECONDS": "0.2",
    # Giving up on a shard has its own test; here every line must get its real answer.
    "MAX_SHARD_ATTEMPTS": "50",
    "WORKER_CONCURRENCY": "4",
    # Live counts in finer steps than the default 1 s: the cancel test waits to see some answers.
    "PROGRESS_SECONDS": "0.25",
    # The model's own log of what it answered (`support.live.AnswerLog`).
    "POWERTOOLS_LOG_LEVEL": "DEBUG",
}


# What caches the variables changed here, in each function's environments.
RESETS = ["batchinfer.core.settings.get_settings.cache_clear", "batchinfer.core.chaos.reset"]


# At most 6 shard workers at once (the template's default is 20): each execution environment loads the
# model (about 1 GB resident), and 20 of them on this machine's 2 cores and 24 GB ran it out of memory;
# the crashes still find fresh environments to retry in. Every worker for the one account
# (AccountShardShare 1): the suite is about faults, and a share's waits (5 s re-sends) would stretch
# its cancel cases' timing.
FAULTS = StackConfig(
    "fault-suite",
    schedule_interval=1.0,
    parameter_overrides={
        "ShardSize": "4",
        "RemoteShardSize": "4",
        "MaxShardWorkers": "6",
        "AccountShardShare": "1",
    },
    function_environment=FAST_RECOVERY,
    heavy=True,
)
pytestmark = [*pytestmark, FAULTS.mark]


# The model with room for this suite's requests only (a 30-token prompt, 2 tokens out, WORKER_CONCURRENCY
# sequences): every crash starts a fresh environment that loads the model, and the default entry's 16
# sequences of 2,048 tokens allocate a 720 MB cache each time (measured: 9.7 s to the first answer on a
# loaded machine, against 1.6 s with this one).
REGISTRY = "models:\n  smollm2-135m-instruct:\n    backend: llama_cpp\n    n_ctx: 256\n    n_seq_max: 4\n"


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("fault-suite")
    (tmp / "models.yaml").write_text(REGISTRY, encoding="utf-8")
    with shared_stacks.lease(FAULTS, tmp, {"MODEL_REGISTRY": str(tmp / "models.yaml")}) as shared:
        yield shared.stack


def batch_text(tag: str, lines: int = LINES) -> str:
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
        for i in range(lines)
    )


SCENARIOS = {
    "crash_before_commit": {"crash_before_commit": 0.3},
    "crash_after_commit": {"crash_after_commit": 0.3},
    "duplicate_delivery": {"duplicate_delivery": 0.5},
    "backend_error": {"backend_error": 0.3},
    "slow_backend": {"slow_backend": 0.3, "slow_backend_seconds": 0.3},
    "crash_in_aggregator": {"crash_in_aggregator": 0.5},
    # A fifth of the functions' AWS call attempts throttled or 5xx (DynamoDB, S3, SQS): botocore's
    # retries absorb most; a call failing all six attempts fails its invocation (SQS redelivers).
    "aws_error": {"aws_error": 0.2},
    "everything": {
        "crash_before_commit": 0.2,
        "crash_after_commit": 0.2,
        "duplicate_delivery": 0.2,
        "backend_error": 0.2,
        "slow_backend": 0.2,
        "crash_in_aggregator": 0.2,
        "aws_error": 0.1,
    },
}
# With this seed the first draw of every fault's stream is below 0.16: each fault fires at its first chance
# (but aws_error, 0.39: it has a chance at every AWS call), in every environment, since every one draws
# the seed's sequence (`per_environment` false; by default each draws its own).
SEED = 1440


def run_batch(
    stack: LocalStack, scenario: str, path: Path, on_poll: Any = None, create: Any = None
) -> tuple[BatchClient, list[dict[str, Any]], list[str], dict[str, int]]:
    """Run `path` under the scenario's faults, GET polled every 0.2 s until terminal: (client, every
    snapshot, completion ids the model answered, faults fired). `create(client)`: how the batch is
    created, its id (default: `path` uploaded and a batch of it)."""
    stack.wait_idle(300)  # nothing of the previous scenario still runs (an invocation keeps its variables)
    faults = {"seed": SEED, "per_environment": False, **SCENARIOS[scenario]}
    # The API function too: a call of the test's failing past botocore's retries is a 503, which
    # `BatchClient` retries after its Retry-After (creates with one Idempotency-Key: no second batch).
    stack.configure_functions({"BATCHINFER_CHAOS": json.dumps(faults)}, call=RESETS)
    stack.reset_stats()
    try:
        client = BatchClient(f"{stack.base_url}/v1", stack.api_key)
        with AnswerLog() as answers:
            batch_id = create(client) if create else client.create(client.upload(path)["id"])["id"]
            series = watch(lambda: client.retrieve(batch_id), on_poll=on_poll, timeout_s=300)
            stack.wait_idle(300)  # every answer's log line is in
        fired = {
            name.removeprefix("chaos:"): count
            for name, count in stack.stats().items()
            if name.startswith("chaos:")
        }
    finally:
        stack.configure_functions(unset=["BATCHINFER_CHAOS"], call=RESETS)
    return client, series, answers.ids, fired


def results(client: BatchClient, batch: dict[str, Any]) -> tuple[bytes | None, bytes | None]:
    output = client.content(batch["output_file_id"]) if batch["output_file_id"] else None
    errors = client.content(batch["error_file_id"]) if batch["error_file_id"] else None
    return output, errors


def completion_ids(output: bytes | None) -> list[str]:
    return sorted(json.loads(line)["response"]["body"]["id"] for line in (output or b"").splitlines())


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_invariant_holds_under(stack: LocalStack, scenario: str, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(batch_text(scenario))
    reads: list[bytes] = []
    reader = BatchClient(f"{stack.base_url}/v1", stack.api_key)

    def read_output(batch: dict[str, Any]) -> None:  # at every GET while it runs
        reads.append(reader.output_page(batch["id"])[0])

    client, series, answered, fired = run_batch(stack, scenario, path, on_poll=read_output)
    batch = series[-1]
    output, errors = results(client, batch)
    assert batch["status"] == "completed"
    faults = {name for name in SCENARIOS[scenario] if not name.endswith("_seconds")}
    assert {name for name, count in fired.items() if count} == faults  # every fault of the scenario happened
    assert_batch_invariant(batch, path.read_text(), output, errors)
    if scenario not in ("backend_error", "everything"):
        assert batch["request_counts"]["failed"] == 0, errors[:600]
    # Live counts: never down while it ran, exact at the end; no answer lost or repeated.
    assert_counts_monotonic(series)
    assert completion_ids(output) == sorted(answered)
    # Every output read while it ran begins the final file: no line twice, none the file lacks
    assert reads and all((output or b"").startswith(read) for read in reads)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_cancel_mid_run_keeps_every_answer_under(stack: LocalStack, scenario: str, tmp_path: Path) -> None:
    # Given a batch under the scenario's faults, cancelled once GET shows 4 answers
    path = tmp_path / "in.jsonl"
    path.write_text(batch_text(f"cancel-{scenario}", CANCEL_LINES))
    cancelled: list[dict[str, Any]] = []
    client = BatchClient(f"{stack.base_url}/v1", stack.api_key)

    def cancel_after_some_answers(batch: dict[str, Any]) -> None:
        if not cancelled and batch["request_counts"]["completed"] >= 4:
            cancelled.append(client.cancel(batch["id"]))

    _, series, answered, fired = run_batch(stack, scenario, path, on_poll=cancel_after_some_answers)
    batch = series[-1]
    output, errors = results(client, batch)

    # Then it ends cancelled with every answer the model gave, the rest never ran
    assert cancelled and cancelled[0]["status"] in ("cancelling", "cancelled")
    assert batch["status"] == "cancelled"
    if "aws_error" in SCENARIOS[scenario]:  # how many depends on the calls the timing makes: not fixed
        assert fired.get("aws_error", 0) >= 1
    assert_batch_invariant(batch, path.read_text(), output, errors)
    assert completion_ids(output) == sorted(answered)
    assert batch["request_counts"]["completed"] >= 4
    never_ran = [json.loads(line)["error"] for line in (errors or b"").splitlines()]
    assert {error["code"] for error in never_ran if error} <= {"batch_cancelled"}
    assert_counts_monotonic([b for b in series if b["status"] != "cancelled"])


def test_an_anthropic_message_batch_under_crashes(stack: LocalStack, tmp_path: Path) -> None:
    # Given a Message Batch (the anthropic SDK's create) whose workers crash before commits
    requests = [json.loads(line) for line in batch_text("anthropic", 8).splitlines()]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"custom_id": r["custom_id"]}) + "\n" for r in requests))
    sdk = Anthropic(base_url=stack.base_url, api_key=stack.api_key)
    entries = [{"custom_id": r["custom_id"], "params": r["body"]} for r in requests]

    def create(_: BatchClient) -> str:
        return sdk.messages.batches.create(requests=entries).id

    client, series, answered, fired = run_batch(stack, "crash_before_commit", path, create=create)
    batch = series[-1]
    output, errors = results(client, batch)

    # Then every request has its one answer, through either dialect
    assert (batch["status"], fired.get("crash_before_commit", 0) >= 1) == ("completed", True)
    assert_batch_invariant(batch, path.read_text(), output, errors)
    assert_counts_monotonic(series)
    # And in Anthropic's dialect: every request once (nothing lost, nothing twice), all succeeded
    ended = sdk.messages.batches.retrieve(batch["id"])
    assert ended.processing_status == "ended"
    assert ended.request_counts.model_dump() == {
        "processing": 0,
        "succeeded": len(requests),
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    lines = list(sdk.messages.batches.results(batch["id"]))
    assert [line.custom_id for line in lines] == [r["custom_id"] for r in requests]
    assert {line.result.type for line in lines} == {"succeeded"}
    answers = sorted(f"msg_{completion.removeprefix('chatcmpl-')}" for completion in answered)
    assert sorted(line.result.message.id for line in lines) == answers
