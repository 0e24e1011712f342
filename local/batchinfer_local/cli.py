"""`batchinfer`: run the local stack, submit batches and fetch their results.

    batchinfer local [--port 8000]            the whole pipeline on this machine, in the foreground
    batchinfer submit FILE [--wait]           upload a JSONL file and create a batch
    batchinfer status BATCH_ID                the Batch object
    batchinfer download BATCH_ID [-o DIR]     output.jsonl and error.jsonl
    batchinfer demo FILE                      local stack + submit --wait + print answers, then stop

The client commands talk to `--base-url` (default `$BATCHINFER_BASE_URL`, else the local stack at
http://127.0.0.1:8000/v1) with `--api-key` (default `$BATCHINFER_API_KEY`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from batchinfer_local.client import BatchClient

console = Console()
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


def _client(args: argparse.Namespace) -> BatchClient:
    return BatchClient(args.base_url, args.api_key)


def submit_and_wait(client: BatchClient, path: Path, *, wait: bool) -> dict[str, Any]:
    """Upload `path`, create its batch and (with `wait`) show live `request_counts` until it is terminal."""
    uploaded = client.upload(path)
    batch = client.create(uploaded["id"])
    console.print(f"batch [bold]{batch['id']}[/] created from {path} ({uploaded['bytes']} bytes)")
    if not wait:
        return batch
    columns = (TextColumn("{task.fields[status]:<11}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("failed {task.fields[failed]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("batch", total=None, status="validating", failed=0)

        def show(current: dict[str, Any]) -> None:
            counts = current["request_counts"]
            progress.update(task, total=counts["total"] or None, completed=counts["completed"] + counts["failed"],
                            status=current["status"], failed=counts["failed"])

        return client.wait(batch["id"], on_update=show)


def print_answers(client: BatchClient, batch: dict[str, Any]) -> None:
    """One line per request: custom_id, then the model's answer or the error."""
    lines = []
    for file_id in (batch.get("output_file_id"), batch.get("error_file_id")):
        if file_id:
            lines += [json.loads(raw) for raw in client.content(file_id).splitlines() if raw.strip()]
    for line in sorted(lines, key=lambda item: item["custom_id"]):
        response = line.get("response") or {}
        if response.get("status_code") == 200:
            answer = response["body"]["choices"][0]["message"]["content"].strip()
            console.print(f"[bold cyan]{line['custom_id']}[/]: {answer}", highlight=False)
        else:
            error = line.get("error") or (response.get("body") or {}).get("error")
            console.print(f"[bold red]{line['custom_id']}[/]: error {error}", highlight=False)


def _summary(batch: dict[str, Any]) -> None:
    counts = batch["request_counts"]
    console.print(f"batch {batch['id']}: [bold]{batch['status']}[/], {counts['completed']}/{counts['total']} "
                  f"completed, {counts['failed']} failed; output_file_id={batch.get('output_file_id')} "
                  f"error_file_id={batch.get('error_file_id')}")
    for error in (batch.get("errors") or {}).get("data") or []:
        console.print(f"  line {error.get('line')}: {error['code']}: {error['message']}", highlight=False)


def cmd_local(args: argparse.Namespace) -> int:
    from batchinfer_local.stack import LocalStack

    with LocalStack(port=args.port) as stack:
        console.print(f"batchinfer local stack: base URL [bold]{stack.base_url}/v1[/] (Ctrl-C to stop)")
        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        try:
            stopped.wait()
        except KeyboardInterrupt:
            pass
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    batch = submit_and_wait(_client(args), Path(args.file), wait=args.wait)
    _summary(batch)
    return 0 if batch["status"] in ("completed", "validating", "in_progress") else 1


def cmd_status(args: argparse.Namespace) -> int:
    console.print_json(json.dumps(_client(args).retrieve(args.batch_id)))
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    client = _client(args)
    batch = client.retrieve(args.batch_id)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for kind in ("output", "error"):
        if file_id := batch.get(f"{kind}_file_id"):
            (out / f"{kind}.jsonl").write_bytes(client.content(file_id))
            console.print(f"wrote {out / f'{kind}.jsonl'}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from batchinfer_local.stack import LocalStack

    with LocalStack(port=args.port) as stack:
        logging.getLogger("batchinfer").setLevel(logging.WARNING)  # the progress bar, not the handlers' logs
        console.print(f"local stack up at {stack.base_url}/v1 (moto on {stack.moto_endpoint})")
        client = BatchClient(f"{stack.base_url}/v1")
        batch = submit_and_wait(client, Path(args.file), wait=True)
        print_answers(client, batch)
        _summary(batch)
    return 0 if batch["status"] == "completed" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="batchinfer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default=os.environ.get("BATCHINFER_BASE_URL", DEFAULT_BASE_URL))
    parser.add_argument("--api-key", default=os.environ.get("BATCHINFER_API_KEY"))
    commands = parser.add_subparsers(dest="command", required=True)
    local = commands.add_parser("local", help="run the whole pipeline locally")
    local.add_argument("--port", type=int, default=int(os.environ.get("BATCHINFER_PORT", "8000")))
    local.set_defaults(run=cmd_local)
    submit = commands.add_parser("submit", help="upload a JSONL file and create a batch")
    submit.add_argument("file")
    submit.add_argument("--wait", action="store_true", help="show progress until the batch ends")
    submit.set_defaults(run=cmd_submit)
    status = commands.add_parser("status", help="print a batch")
    status.add_argument("batch_id")
    status.set_defaults(run=cmd_status)
    download = commands.add_parser("download", help="download a batch's result files")
    download.add_argument("batch_id")
    download.add_argument("-o", "--output", default=".")
    download.set_defaults(run=cmd_download)
    demo = commands.add_parser("demo", help="local stack + a sample batch, answers printed")
    demo.add_argument("file")
    demo.add_argument("--port", type=int, default=0, help="0: any free port")
    demo.set_defaults(run=cmd_demo)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
