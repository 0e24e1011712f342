"""The local stack is as strict as AWS where a deployment breaks: IAM per function, Lambda's concurrency.

- A statement removed from (a copy of) template.yaml takes away exactly the call it allowed: the
  cancel route, whose FinalizeQueue send it allowed, then fails as it would on AWS (enforcement cannot
  be silently off).
- 20 shards run at once, as MaxShardWorkers allows, and every line still ends in exactly one file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from batchinfer_local import DEFAULT_TEMPLATE
from support.api_stack import (
    SCRIPTED,
    api_client,
    chat_line,
    create,
    jsonl,
    result_lines,
    stack_with_upstream,
    upload,
    wait_for,
    wait_until,
)
from support.invariant import assert_batch_invariant

pytestmark = pytest.mark.timeout(300)

CANCEL_STATEMENT = """\
        # POST /v1/batches/{id}/cancel hands the batch to the aggregator.
        - SQSSendMessagePolicy:
            QueueName: !GetAtt FinalizeQueue.QueueName
"""


def template_without(tmp_path: Path, statement: str) -> Path:
    """A copy of template.yaml without `statement`, beside links to the code it names."""
    text = DEFAULT_TEMPLATE.read_text()
    assert text.count(statement) == 1
    for code in ("functions", "layers"):
        (tmp_path / code).symlink_to(DEFAULT_TEMPLATE.parent / code)
    path = tmp_path / "template.yaml"
    path.write_text(text.replace(statement, ""))
    return path


def test_a_removed_statement_denies_the_call_it_allowed(tmp_path: Path) -> None:
    path = template_without(tmp_path, CANCEL_STATEMENT)
    # A stack of its own: its template is this test's (one statement removed).
    with stack_with_upstream(
        tmp_path, template_path=path, parameter_overrides={"ShardSize": "1", "RemoteShardSize": "1"}
    ) as (
        stack,
        upstream,
    ):
        finalize = stack.queue_urls["FinalizeQueue"]
        # The API function's own credentials may no longer send to FinalizeQueue
        # (they still may to PrepareQueue)
        api = stack.function_client("ApiFunction", "sqs")
        with pytest.raises(ClientError) as denied:
            api.send_message(QueueUrl=finalize, MessageBody="{}")
        assert denied.value.response["Error"]["Code"] == "AccessDenied"
        assert "sqs:SendMessage" in denied.value.response["Error"]["Message"]
        with api_client(stack, stack.api_key) as http:
            batch = create(http, upload(http, jsonl(chat_line("a", "HOLD", model=SCRIPTED)))).json()
            wait_until(upstream.held.is_set, what="the HOLD request")
            # So a cancel is a 500, as on AWS, and the batch is left cancelling:
            # nothing reached the aggregator
            cancel = http.post(f"/batches/{batch['id']}/cancel")
            assert cancel.status_code == 500
            assert http.get(f"/batches/{batch['id']}").json()["status"] == "cancelling"
            counts = stack.sqs.get_queue_attributes(QueueUrl=finalize, AttributeNames=["All"])["Attributes"]
            assert (
                counts["ApproximateNumberOfMessages"],
                counts["ApproximateNumberOfMessagesNotVisible"],
            ) == ("0", "0")


def test_twenty_shards_run_at_once_and_every_line_ends_in_exactly_one_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = [chat_line(f"line-{n:02d}", f"HOLD {n}", model=SCRIPTED) for n in range(20)]
    caplog.set_level(logging.INFO, logger="batchinfer_local.function")
    # One account's batch: every worker may run its shards (AccountShardShare 1: no per-account bound).
    # A stack of its own: it reads every forwarded log line of the run, and counts the workers' peak.
    overrides = {"ShardSize": "1", "RemoteShardSize": "1", "AccountShardShare": "1"}
    with (
        stack_with_upstream(tmp_path, parameter_overrides=overrides) as (stack, upstream),
        api_client(stack, stack.api_key) as http,
    ):
        assert stack.pool_stats("ShardWorkerFunction").limit == 20  # MaxShardWorkers
        data = jsonl(*lines)
        batch_id = create(http, upload(http, data)).json()["id"]
        # Each shard's one request is held at the model: all 20 shard workers are running at once.
        wait_until(lambda: len(upstream.arrivals) == 20, timeout=120, what="20 requests held at once")
        peak = stack.pool_stats("ShardWorkerFunction").peak
        upstream.release()
        batch = wait_for(http, batch_id)
        output = result_lines(http, batch["output_file_id"])
        stats = stack.pool_stats("ShardWorkerFunction")
        names = {logical_id: spec.function_name for logical_id, spec in stack.functions.items()}
    print(
        f"shard-worker invocations at once: {peak}"
        f" (of {stats.invocations}, {stats.environments} environments)"
    )
    assert peak == 20
    assert batch["status"] == "completed"
    assert [line["custom_id"] for line in output] == [f"line-{n:02d}" for n in range(20)]
    assert_batch_invariant(batch, data, b"".join(json.dumps(line).encode() + b"\n" for line in output), None)
    # Every function's log lines carry that function's own name (each environment its own Logger).
    labelled = [
        (record.name.rsplit(".", 1)[1], json.loads(record.getMessage()))
        for record in caplog.records
        if record.name.startswith("batchinfer_local.function.") and record.getMessage().startswith("{")
    ]
    shard_lines = [
        line
        for function, line in labelled
        # (the function's EMF metrics are JSON lines too, without a "message")
        if function == "ShardWorkerFunction" and line.get("message") == "shard"
    ]
    assert len(shard_lines) == 20
    assert {function for function, _ in labelled} >= {
        "PrepareFunction",
        "ShardWorkerFunction",
        "AggregatorFunction",
    }
    assert all(
        line["function_name"] == names[function] for function, line in labelled if "function_name" in line
    )
    assert len({line["function_request_id"] for line in shard_lines}) == 20
