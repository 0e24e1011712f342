"""`batchinfer local` (the whole pipeline on this machine, in the foreground) and `batchinfer demo`
(a local stack, a sample batch and its answers, then stop)."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from batchinfer.wire.status import BatchStatus
from batchinfer_local.cli.batches import summary
from batchinfer_local.cli.common import CliError, Commands, console
from batchinfer_local.cli.progress import follow
from batchinfer_local.cli.state import state_path, write_state
from batchinfer_local.client import BatchClient


def register(commands: Commands) -> None:
    """Add `local` and `demo`."""
    local = commands.add("local", cmd_local, "run the whole pipeline locally")
    local.add_argument("--port", type=int, default=int(os.environ.get("BATCHINFER_PORT", "8000")))
    local.add_argument(
        "--no-iam",
        action="store_true",
        help="don't enforce IAM (for debugging; also BATCHINFER_LOCAL_IAM=off)",
    )
    demo = commands.add("demo", cmd_demo, "local stack + a sample batch, answers printed")
    demo.add_argument("file")
    demo.add_argument("--port", type=int, default=0, help="0: any free port")
    demo.add_argument(
        "--no-iam", action="store_true", help="don't enforce IAM (also BATCHINFER_LOCAL_IAM=off)"
    )


class _FunctionLabel(logging.Formatter):
    """`[LogicalId] line`: the function a forwarded line came from (its logger is
    `batchinfer_local.function.<LogicalId>`), also for lines that are not Powertools JSON."""

    def format(self, record: logging.LogRecord) -> str:
        return f"[{record.name.rsplit('.', 1)[-1]}] {record.getMessage()}"


@contextmanager
def show_function_logs(level: int) -> Iterator[None]:
    """While in the block, print the functions' log lines (forwarded from their processes) at `level`
    and above, each labelled with its function."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_FunctionLabel())
    functions = logging.getLogger("batchinfer_local.function")
    saved = (functions.level, functions.propagate)
    functions.addHandler(handler)
    functions.setLevel(level)
    functions.propagate = False
    try:
        yield
    finally:
        functions.removeHandler(handler)
        functions.level, functions.propagate = saved


def _iam_line(stack: Any) -> str:
    from batchinfer_local.stack import IAM_ENV

    if stack.iam_enforced:
        return (
            f"IAM: [bold]enforced[/] (each function calls with its own role; --no-iam or {IAM_ENV}=off "
            "turns it off)"
        )
    return f"IAM: [bold red]not enforced[/] (--no-iam or {IAM_ENV}=off): AWS would deny what it denies"


def start(stack: Any, port: int) -> None:
    """Start `stack`; a port in use is one line, found before the functions start (and again after)."""
    in_use = CliError(
        f"error: port {port} is already in use: stop what listens there, or choose another port "
        f"(`batchinfer local --port N`, `make local PORT=N`)"
    )
    try:
        if port:
            with socket.socket() as probe:
                probe.bind((stack.host, port))
        stack.start()
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise in_use from None
        raise


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
            console.print(f"[bold cyan]{line['custom_id']}[/]: {answer}")
        else:
            error = line.get("error") or (response.get("body") or {}).get("error")
            console.print(f"[bold red]{line['custom_id']}[/]: error {error}")


def cmd_local(args: argparse.Namespace) -> int:
    """Run the local stack until Ctrl-C or SIGTERM, printing how to use it and the functions' logs."""
    from batchinfer_local.stack import LocalStack

    with show_function_logs(logging.INFO):
        return _run_local(LocalStack(port=args.port, iam=False if args.no_iam else None), args.port)


def _run_local(stack: Any, port: int) -> int:
    start(stack, port)
    state = state_path()
    try:
        _print_usage(stack)
        write_state(stack, state)
        console.print(
            f"moto: {stack.moto_endpoint}, table {stack.environment['TABLE_NAME']}: "
            f"`batchinfer keys|accounts|buckets ... --local` use them (state in {state})"
        )
        stopped = threading.Event()
        # SIGINT too: a process started in the background (a script's `&`, a test runner's worker)
        # inherits SIGINT ignored, and Python then never raises KeyboardInterrupt.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stopped.set())
        stopped.wait()
    finally:
        state.unlink(missing_ok=True)
        stack.stop()
    return 0


def _print_usage(stack: Any) -> None:
    from batchinfer_local.stack import DEV_ACCOUNT, DEV_API_KEY_ENV

    base = f"{stack.base_url}/v1"
    console.print(f"batchinfer local stack: base URL [bold]{base}[/] (Ctrl-C to stop)")
    console.print(f"web console: [bold]{stack.base_url}/console/[/] (sign in with the API key below)")
    console.print(_iam_line(stack))
    origin = (
        f"generated; set ${DEV_API_KEY_ENV} to choose it"
        if stack.api_key_generated
        else f"from ${DEV_API_KEY_ENV}"
    )
    console.print(f"API key (account {DEV_ACCOUNT!r}, {origin}): [bold]{stack.api_key}[/]")
    console.print(f"  in another shell: export BATCHINFER_API_KEY={stack.api_key} BATCHINFER_BASE_URL={base}")
    bucket = stack.buckets["DataBucket"]
    console.print(f"data bucket: [bold]{bucket}[/] (inbox uploads: s3://{bucket}/inbox/<path>.jsonl)")


def cmd_demo(args: argparse.Namespace) -> int:
    """A local stack, the batch of FILE with a progress bar, its answers; exit 1 unless it completed."""
    from batchinfer_local.stack import LocalStack

    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"error: no such file: {path}", code=2)
    with show_function_logs(logging.WARNING):  # the progress bar, not the handlers' logs
        return _run_demo(path, args.port, LocalStack(port=args.port, iam=False if args.no_iam else None))


def _run_demo(path: Path, port: int, stack: Any) -> int:
    start(stack, port)
    try:
        console.print(f"local stack up at {stack.base_url}/v1 (moto on {stack.moto_endpoint})")
        console.print(_iam_line(stack))
        client = BatchClient(f"{stack.base_url}/v1", stack.api_key)
        uploaded = client.upload(path)
        batch = client.create(uploaded["id"])
        console.print(f"batch [bold]{batch['id']}[/] created from {path} ({uploaded['bytes']} bytes)")
        batch = follow(client, batch["id"], show=True)
        print_answers(client, batch)
        summary(batch)
    finally:
        stack.stop()
    return 0 if batch["status"] == BatchStatus.COMPLETED else 1
