"""Prepare: validation + sharding throughput against raw `json.loads`, and peak memory by file size.

Throughput runs the code prepare runs (`iter_physical_lines` over 1 MiB chunks, as S3 streams
them, then `prepare.shard_lines`: validation and shard files) on lines held in memory, so S3's
speed does not blur it; the reference is `json.loads` of the same lines, already split. Both are
timed alternately, best of three.

Peak memory runs the whole `prepare_batch` of a 10k, 100k and 1M-line file, each in a fresh
process (its peak RSS: VmHWM), with moto as a server process of its own. The limits are
raised so that a million lines is a valid batch (OpenAI's are 50,000 requests and 200 MB), and
are the same for all three sizes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from benchmarks.common import REPO, Stopwatch

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a helpful assistant. Answer briefly and precisely."
LIMITS = {"MAX_REQUESTS_PER_FILE": "1000000", "MAX_FILE_BYTES": str(1024**3)}


def line(i: int) -> bytes:
    """Request `i` of the benchmark input files: a realistic chat request, about 330 bytes."""
    return (
        json.dumps(
            {
                "custom_id": f"request-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "max_tokens": 128,
                    "temperature": 0.7,
                    "messages": [
                        {"role": "system", "content": SYSTEM},
                        {
                            "role": "user",
                            "content": f"Question {i}: in one sentence, why is the sky "
                            f"blue at noon and red at sunset?",
                        },
                    ],
                },
            }
        ).encode()
        + b"\n"
    )


def lines(n: int) -> Iterator[bytes]:
    return (line(i) for i in range(n))


def _chunks(data: bytes, size: int = 1024 * 1024) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def throughput(n: int = 100_000, rounds: int = 3) -> dict[str, Any]:
    """Lines/s of prepare's validation + sharding and of raw `json.loads`, side by side."""
    from batchinfer.core.settings import Settings
    from batchinfer.pipeline.prepare import shard_lines
    from batchinfer.validation.file import FileValidator
    from batchinfer.validation.jsonl import iter_physical_lines

    defaults = {name: field.default for name, field in Settings.model_fields.items()}
    raw_lines = list(lines(n))
    chunks = _chunks(b"".join(raw_lines))

    def ours() -> None:
        validator = FileValidator(
            "/v1/chat/completions",
            {MODEL}.__contains__,
            max_requests=defaults["max_requests_per_file"],
            max_file_bytes=defaults["max_file_bytes"],
            max_line_bytes=defaults["max_line_bytes"],
        )
        reader = iter_physical_lines(
            chunks, defaults["max_line_bytes"], max_total_bytes=defaults["max_file_bytes"]
        )
        shards = sum(1 for _ in shard_lines(reader, validator, lambda _model: defaults["shard_size"]))
        assert validator.ok and shards == -(-n // defaults["shard_size"]), validator.errors[:3]

    def raw() -> None:
        loads = json.loads
        for data in raw_lines:
            loads(data)

    best = {"batchinfer": float("inf"), "json.loads": float("inf")}
    for _ in range(rounds):
        for name, run in (("batchinfer", ours), ("json.loads", raw)):
            with Stopwatch() as watch:
                run()
            best[name] = min(best[name], watch.seconds)
    return {
        "lines": n,
        "line_bytes": len(raw_lines[0]),
        "ours": n / best["batchinfer"],
        "raw": n / best["json.loads"],
    }


def _child(batch_id: str) -> None:
    # In the measured process: prepare one batch, report its peak RSS.
    from batchinfer.pipeline.prepare import prepare_batch

    before_kib = _peak_rss_kib()
    started = time.perf_counter()
    outcome = prepare_batch(batch_id)
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "outcome": outcome,
                "seconds": seconds,
                "peak_mib": _peak_rss_kib() / 1024,
                "imports_mib": before_kib / 1024,
            }
        )
    )


def _peak_rss_kib() -> int:
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over exec from the forking parent.
    with open("/proc/self/status") as status:
        return next(int(row.split()[1]) for row in status if row.startswith("VmHWM:"))


def peak_rss(sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)) -> dict[int, dict[str, Any]]:
    """Peak RSS (MiB) of `prepare_batch` on files of `sizes` lines, each in a fresh process."""
    from batchinfer.core import ids
    from batchinfer.core.settings import get_settings
    from batchinfer.data import batches
    from batchinfer.data.s3 import upload_stream
    from batchinfer.pipeline import intake
    from benchmarks.aws_env import moto_environment

    results = {}
    with moto_environment(LIMITS):
        bucket = get_settings().bucket_name
        for n in sizes:
            key = f"files/bench-{n}"
            size = upload_stream(bucket, key, lines(n))
            batch_id = ids.new_batch_id()
            intake.create_batch(
                batch_id=batch_id,
                account_id="default",
                input_file_id=f"file-{n}",
                input_bucket=bucket,
                input_key=key,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.prepare_bench", "--child", batch_id],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(done.stdout.strip().splitlines()[-1])
            header = batches.get(batch_id)
            assert result["outcome"] == "in_progress", result
            assert header is not None and header.request_counts.total == n, header
            results[n] = {**result, "file_mib": size / 2**20}
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", metavar="BATCH_ID")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    args = parser.parse_args()
    if args.child:
        _child(args.child)
    else:
        print(throughput())
        print(peak_rss(tuple(int(s) for s in args.sizes.split(","))))
