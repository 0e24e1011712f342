"""`batchinfer redrive`: dead letters go back to their queue and are processed."""

from __future__ import annotations

import json
from pathlib import Path

from batchinfer_local.cli import main
from support.stacks import DEFAULT, SharedStacks

pytestmark = DEFAULT.mark


def test_redrive_moves_dead_letters_back_and_they_run(shared_stacks: SharedStacks, tmp_path: Path) -> None:
    # The shared stack is idle when a module leases it and the dead-letter queue empty: the redrive moves
    # every dead letter there is, and the count of aggregator runs must be exactly this test's 12.
    with shared_stacks.lease(DEFAULT, tmp_path) as shared:
        stack = shared.stack
        dlq, queue = stack.queue_urls["FinalizeDeadLetterQueue"], stack.queue_urls["FinalizeQueue"]
        stack.sqs.purge_queue(QueueUrl=dlq)  # no dead letter of an earlier module's
        for n in range(12):
            stack.sqs.send_message(QueueUrl=dlq, MessageBody=json.dumps({"batch_id": f"batch_gone{n}"}))
        before = stack.invocations("AggregatorFunction")

        assert main(["redrive", dlq, "--to", queue, "--endpoint-url", stack.moto_endpoint]) == 0
        stack.wait_idle(timeout=60)

        counts = stack.sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
        assert counts["Attributes"]["ApproximateNumberOfMessages"] == "0"
        assert stack.invocations("AggregatorFunction") == before + 12  # BatchSize 1: one invocation each
