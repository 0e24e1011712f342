"""AWS calls per 1,000 requests, by service and operation, and what they cost per million requests.

A batch runs end to end on the local stack (every function's handler, wired by template.yaml, with
the template's default shard sizes: RemoteShardSize for the simulated backend, a server of its own)
against the simulated backend; `batchinfer.core.aws.on_call`, in
every function's own processes, counts every call the functions make (`LocalStack.stats`). The SQS
event source mappings' own receives and deletes are made by the Lambda service, not by batchinfer:
they are estimated (one receive and one delete per message).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.saturation import SimBackend, request_line

# Public on-demand prices, us-east-1 (aws.amazon.com/lambda|sqs|dynamodb|s3/pricing, checked 2025):
# Lambda $0.0000166667 per GB-s on x86_64, $0.0000133334 on arm64 (Graviton; first pricing tier of
# each), $0.20 per million invocations on both; SQS standard $0.40 per
# million requests; DynamoDB on-demand $0.625 per million write and $0.125 per million read request
# units; S3 Standard $0.005 per 1,000 PUT/COPY/POST/LIST and $0.0004 per 1,000 GET/HEAD requests.
LAMBDA_GB_S = {"x86_64": 0.0000166667, "arm64": 0.0000133334}
PRICES = {
    "lambda_invocation": 0.20e-6,
    "sqs": 0.40e-6,
    "ddb_write": 0.625e-6,
    "ddb_read": 0.125e-6,
    "s3_write": 0.005e-3,
    "s3_read": 0.0004e-3,
}
# Request units per call (items are under 1 KB, reads strongly consistent): a transaction costs
# twice per item, and the commit transaction writes the shard and the header; a query reads 4 KB pages.
DDB_UNITS = {
    "GetItem": ("read", 1),
    "Query": ("read", 1),
    "PutItem": ("write", 1),
    "UpdateItem": ("write", 1),
    "DeleteItem": ("write", 1),
    "TransactWriteItems": ("write", 4),
    "BatchWriteItem": ("write", 25),
    "TransactGetItems": ("read", 4),
}
S3_READS = {"GetObject", "HeadObject"}


def measure(n: int = 5000, shard_size: int | None = None) -> dict[str, Any]:
    """Run an `n`-request batch through the local stack (template defaults, or `shard_size`
    requests per shard); the calls it made, by (service, operation)."""
    from batchinfer_local import LocalStack
    from benchmarks.common import quiet_functions

    quiet_functions()
    from batchinfer_local.client import BatchClient

    counts: Counter[tuple[str, str]] = Counter()
    saved = os.environ.get("MODEL_REGISTRY")
    with SimBackend(latency=0.01, capacity=512) as sim, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batch.jsonl"
        path.write_bytes(b"".join(json.dumps(request_line(i)).encode() + b"\n" for i in range(n)))
        os.environ["MODEL_REGISTRY"] = str(sim.registry(Path(tmp)))  # passed through to the functions
        try:
            overrides = (
                {"ShardSize": str(shard_size), "RemoteShardSize": str(shard_size)} if shard_size else {}
            )
            with LocalStack(port=0, parameter_overrides=overrides) as stack:
                client = BatchClient(f"{stack.base_url}/v1", api_key=stack.api_key)
                batch = client.create(client.upload(path)["id"])
                stack.wait_idle(timeout=900)
                for name, calls in stack.stats().items():  # "aws:<service>.<Operation>"
                    if name.startswith("aws:"):
                        service, _, operation = name.removeprefix("aws:").partition(".")
                        counts[(service, operation)] += calls
                batch = client.retrieve(batch["id"])
                assert batch["status"] == "completed" and batch["request_counts"]["completed"] == n, batch
                output = client.content(batch["output_file_id"])
                assert output.count(b"\n") == n
                shards = -(-n // int(os.environ["REMOTE_SHARD_SIZE"]))  # the simulated server's
        finally:
            if saved is None:
                os.environ.pop("MODEL_REGISTRY", None)
            else:
                os.environ["MODEL_REGISTRY"] = saved
    return {
        "requests": n,
        "shards": shards,
        "counts": dict(counts),
        # prepare, shard and finalize messages, each received and deleted by an event source mapping
        "esm_calls": 2 * (1 + shards + 1),
    }


def cost_per_million(
    result: dict[str, Any], worker_ms: float, basis: str, architecture: str = "x86_64"
) -> list[tuple[str, float, str]]:
    """(item, dollars per million requests, basis) rows, from the counted calls and `worker_ms`, the
    shard worker's billed (wall) milliseconds per request, measured as `basis` says, with the functions
    on `architecture` (x86_64 or arm64: only Lambda compute differs)."""
    scale = 1_000_000 / result["requests"]
    s3_read = s3_write = sqs = ddb_read = ddb_write = 0.0
    for (service, operation), calls in result["counts"].items():
        if service == "s3":
            if operation in S3_READS:
                s3_read += calls
            else:
                s3_write += calls
        elif service == "sqs":
            sqs += calls
        elif service == "dynamodb":
            kind, units = DDB_UNITS.get(operation, ("write", 1))
            if kind == "read":
                ddb_read += calls * units
            else:
                ddb_write += calls * units
    sqs += result["esm_calls"]
    invocations = result["esm_calls"] / 2 + 4  # one per message, plus the API calls (upload, create, get x2)
    # The shard worker is billed for its wall time at 3,008 MB, mostly waiting on the model; prepare
    # and the aggregator stream at tens of MB/s on 1,024 MB: well under a cent per million requests.
    gb_s = worker_ms / 1000 * 3008 / 1024 * result["requests"]
    return [
        (
            "S3 requests",
            (s3_read * PRICES["s3_read"] + s3_write * PRICES["s3_write"]) * scale,
            f"{s3_write * scale / 1e3:,.0f}k PUT/POST/LIST, {s3_read * scale / 1e3:,.0f}k GET/HEAD",
        ),
        (
            "DynamoDB on-demand",
            (ddb_read * PRICES["ddb_read"] + ddb_write * PRICES["ddb_write"]) * scale,
            f"{ddb_write * scale / 1e3:,.0f}k WRU, {ddb_read * scale / 1e3:,.0f}k RRU",
        ),
        (
            "SQS",
            sqs * PRICES["sqs"] * scale,
            f"{sqs * scale / 1e3:,.0f}k requests (event source receives and deletes estimated)",
        ),
        (
            "Lambda invocations",
            invocations * PRICES["lambda_invocation"] * scale,
            f"{invocations * scale / 1e3:,.1f}k invocations",
        ),
        (
            "Lambda compute (shard worker)",
            gb_s * LAMBDA_GB_S[architecture] * scale,
            f"{worker_ms:.1f} ms per request at 3,008 MB ({basis})",
        ),
    ]


if __name__ == "__main__":
    # python -m benchmarks.aws_calls [SHARD_SIZE ...]: the total per 1,000 requests at each shard size
    for size in [int(a) for a in sys.argv[1:]] or [None]:
        result = measure(int(os.environ.get("N", "5000")), size)
        total = sum(result["counts"].values()) * 1000 / result["requests"]
        print(
            f"shard size {size or 'default'}: {total:.1f} AWS calls per 1,000 requests "
            f"({result['shards']} shards)",
            flush=True,
        )
