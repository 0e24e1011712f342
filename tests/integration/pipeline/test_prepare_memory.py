"""Prepare streams: its peak memory on a 100,000-line (~100 MB) file stays under a fixed bound.

moto runs as a separate server process here, so the traced allocations are prepare's own
(reading, validating, sharding), not the stored objects.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator

import boto3
import pytest

from batchinfer.core import aws, ids
from batchinfer.core.settings import get_settings
from batchinfer.data import batches
from batchinfer.data.s3 import upload_stream
from batchinfer.pipeline import intake
from batchinfer.pipeline.prepare import prepare_batch
from batchinfer_local.functions import function_specs, merged_environment
from batchinfer_local.resources import create_resources
from batchinfer_local.stack import DEFAULT_TEMPLATE
from batchinfer_local.template import Resolver, load_template

LINES = 100_000
BOUND_BYTES = 32 * 1024 * 1024
pytestmark = pytest.mark.timeout(600)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def moto_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            monkeypatch.delenv(key)
        for key, value in {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(key, value)
        template = load_template(DEFAULT_TEMPLATE)
        resolver = Resolver(template, {})
        for logical_id, resource in template["Resources"].items():
            if resource.get("Type") == "AWS::Serverless::HttpApi":
                resolver.add_resource(logical_id, logical_id)
        create_resources(template, resolver, {n: boto3.client(n) for n in ("sqs", "dynamodb", "s3")})
        for key, value in merged_environment(
            function_specs(template, DEFAULT_TEMPLATE.parent, resolver)
        ).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("MAX_REQUESTS_PER_FILE", str(LINES))
        for cached in (aws._session, aws._client, aws._table, get_settings):
            cached.cache_clear()
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=10)
        for cached in (aws._session, aws._client, aws._table, get_settings):
            cached.cache_clear()


def _lines() -> Iterator[bytes]:
    padding = "x" * 900  # ~1 KB lines: the file is far bigger than the bound
    for i in range(LINES):
        yield (
            json.dumps(
                {
                    "custom_id": f"req-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": "smollm2-135m-instruct",
                        "max_tokens": 8,
                        "messages": [{"role": "user", "content": f"{i} {padding}"}],
                    },
                }
            ).encode()
            + b"\n"
        )


def test_prepare_of_100k_lines_stays_under_a_fixed_bound(moto_server: str) -> None:
    # Given a 100,000-line file in S3, streamed there without holding it
    bucket = get_settings().bucket_name
    size = upload_stream(bucket, "files/big", _lines())
    batch_id = ids.new_batch_id()
    intake.create_batch(
        intake.NewBatch(
            batch_id=batch_id,
            account_id="default",
            input_file_id="file-big",
            input_bucket=bucket,
            input_key="files/big",
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    )

    # When prepare runs, with every Python allocation traced
    tracemalloc.start()
    try:
        assert prepare_batch(batch_id) == "in_progress"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Then it sharded everything while its peak stayed far below the file's size
    header = batches.get(batch_id)
    shard_size = get_settings().shard_size
    assert (header.request_counts.total, header.shards_total) == (LINES, -(-LINES // shard_size))
    assert size > 3 * BOUND_BYTES
    print(f"prepare peak {peak / 2**20:.1f} MiB for {size / 2**20:.0f} MiB")
    assert peak < BOUND_BYTES, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB file"
