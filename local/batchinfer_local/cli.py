"""`batchinfer`: run the local stack, submit batches and fetch their results.

    batchinfer local [--port 8000] [--no-iam] the whole pipeline on this machine, in the foreground
    batchinfer submit FILE [--wait]           upload a JSONL file and create a batch
    batchinfer status BATCH_ID                the Batch object
    batchinfer download BATCH_ID [-o DIR]     output.jsonl and error.jsonl
    batchinfer demo FILE                      local stack + submit --wait + print answers, then stop
    batchinfer keys create --account ID       a new API key (printed once; only its hash is stored)
    batchinfer keys revoke KEY_ID|KEY         revoke a key
    batchinfer keys list --account ID         an account's keys
    batchinfer accounts show|set ID ...       bucket allowlist (TokenHub paths) and limit overrides

The client commands talk to `--base-url` (default `$BATCHINFER_BASE_URL`, else the local stack at
http://127.0.0.1:8000/v1) with `--api-key` (default `$BATCHINFER_API_KEY`). The local stack's key
is `$BATCHINFER_DEV_API_KEY`, or one it generates and prints.

`keys` and `accounts` write the batch table directly with your AWS credentials: name it with
`--table` (default `$BATCHINFER_TABLE`) or `--stack-name` (its `TableName` output); `--endpoint-url`
(or `$AWS_ENDPOINT_URL`) points them at a local stack's moto, which `batchinfer local` prints.
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
    columns = (
        TextColumn("{task.fields[status]:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("batch", total=None, status="validating", failed=0)

        def show(current: dict[str, Any]) -> None:
            counts = current["request_counts"]
            progress.update(
                task,
                total=counts["total"] or None,
                completed=counts["completed"] + counts["failed"],
                status=current["status"],
                failed=counts["failed"],
            )

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
    console.print(
        f"batch {batch['id']}: [bold]{batch['status']}[/], {counts['completed']}/{counts['total']} "
        f"completed, {counts['failed']} failed; output_file_id={batch.get('output_file_id')} "
        f"error_file_id={batch.get('error_file_id')}"
    )
    for error in (batch.get("errors") or {}).get("data") or []:
        console.print(f"  line {error.get('line')}: {error['code']}: {error['message']}", highlight=False)


def _show_function_logs(level: int) -> None:
    """Print the functions' log lines (forwarded from their processes) at `level` and above, as they are."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    functions = logging.getLogger("batchinfer_local.function")
    functions.addHandler(handler)
    functions.setLevel(level)
    functions.propagate = False


def _iam_line(stack: Any) -> str:
    from batchinfer_local.stack import IAM_ENV

    if stack.iam_enforced:
        return (
            f"IAM: [bold]enforced[/] (each function calls with its own role; --no-iam or {IAM_ENV}=off "
            "turns it off)"
        )
    return f"IAM: [bold red]not enforced[/] (--no-iam or {IAM_ENV}=off): AWS would deny what it denies"


def cmd_local(args: argparse.Namespace) -> int:
    from batchinfer_local.stack import DEV_ACCOUNT, DEV_API_KEY_ENV, LocalStack

    _show_function_logs(logging.INFO)
    with LocalStack(port=args.port, iam=False if args.no_iam else None) as stack:
        console.print(f"batchinfer local stack: base URL [bold]{stack.base_url}/v1[/] (Ctrl-C to stop)")
        console.print(_iam_line(stack), highlight=False)
        origin = (
            f"generated; set ${DEV_API_KEY_ENV} to choose it"
            if stack.api_key_generated
            else f"from ${DEV_API_KEY_ENV}"
        )
        console.print(
            f"API key (account {DEV_ACCOUNT!r}, {origin}): [bold]{stack.api_key}[/]", highlight=False
        )
        console.print(
            f"moto: {stack.moto_endpoint}, table {stack.environment['TABLE_NAME']} "
            "(for `batchinfer keys|accounts --endpoint-url ... --table ...`, as the stack's admin: "
            "AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing)",
            highlight=False,
        )
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

    _show_function_logs(logging.WARNING)  # the progress bar, not the handlers' logs
    with LocalStack(port=args.port, iam=False if args.no_iam else None) as stack:
        console.print(f"local stack up at {stack.base_url}/v1 (moto on {stack.moto_endpoint})")
        console.print(_iam_line(stack), highlight=False)
        client = BatchClient(f"{stack.base_url}/v1", stack.api_key)
        batch = submit_and_wait(client, Path(args.file), wait=True)
        print_answers(client, batch)
        _summary(batch)
    return 0 if batch["status"] == "completed" else 1


def _table(args: argparse.Namespace) -> Any:
    """The batch table named by --table / $BATCHINFER_TABLE, or by --stack-name's TableName output."""
    import boto3

    session = boto3.session.Session()
    name = args.table
    if not name and args.stack_name:
        stack = session.client("cloudformation").describe_stacks(StackName=args.stack_name)["Stacks"][0]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        name = outputs.get("TableName")
    if not name:
        raise SystemExit("name the batch table with --table (or $BATCHINFER_TABLE) or --stack-name")
    return session.resource("dynamodb", endpoint_url=args.endpoint_url).Table(name)


def cmd_keys(args: argparse.Namespace) -> int:
    from batchinfer.data import accounts

    table = _table(args)
    if args.action == "create":
        secret, key = accounts.create_key(args.account, name=args.name, table=table)
        console.print(
            f"key {key.key_id} for account {key.account_id!r} (shown once, store it now):", highlight=False
        )
        print(secret)
        return 0
    if args.action == "revoke":
        revoked = accounts.revoke_key(args.key, table=table)
        if revoked is None:
            console.print(f"[red]no such key: {args.key}[/]", highlight=False)
            return 1
        console.print(f"revoked {revoked.key_id} of account {revoked.account_id!r}", highlight=False)
        return 0
    for key in accounts.list_keys(args.account, table=table):
        state = f"revoked at {key.revoked_at}" if key.revoked_at else "active"
        console.print(f"{key.key_id}  created {key.created_at}  {state}  {key.name or ''}", highlight=False)
    return 0


def cmd_accounts(args: argparse.Namespace) -> int:
    from batchinfer.data import accounts

    table = _table(args)
    if args.action == "set":
        try:
            account = accounts.configure_account(
                args.account,
                allowed_buckets=args.allow_bucket,
                max_active_batches=args.max_active_batches,
                max_creates_per_minute=args.max_creates_per_minute,
                table=table,
            )
        except ValueError as error:
            console.print(f"[red]{error}[/]", highlight=False)
            return 2
    else:
        account = accounts.get_account(args.account, table=table)
    console.print_json(account.model_dump_json())
    return 0


def cmd_redrive(args: argparse.Namespace) -> int:
    import boto3

    from batchinfer_local.redrive import redrive

    moved = redrive(
        boto3.client("sqs", endpoint_url=args.endpoint_url), args.dlq_url, args.target_url, limit=args.limit
    )
    console.print(f"moved {moved} message(s) to {args.target_url}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="batchinfer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default=os.environ.get("BATCHINFER_BASE_URL", DEFAULT_BASE_URL))
    parser.add_argument("--api-key", default=os.environ.get("BATCHINFER_API_KEY"))
    commands = parser.add_subparsers(dest="command", required=True)
    local = commands.add_parser("local", help="run the whole pipeline locally")
    local.add_argument("--port", type=int, default=int(os.environ.get("BATCHINFER_PORT", "8000")))
    local.add_argument(
        "--no-iam",
        action="store_true",
        help="don't enforce IAM (for debugging; also BATCHINFER_LOCAL_IAM=off)",
    )
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
    demo.add_argument(
        "--no-iam", action="store_true", help="don't enforce IAM (also BATCHINFER_LOCAL_IAM=off)"
    )
    demo.set_defaults(run=cmd_demo)
    admin = argparse.ArgumentParser(add_help=False)
    admin.add_argument("--table", default=os.environ.get("BATCHINFER_TABLE"), help="the batch table's name")
    admin.add_argument("--stack-name", help="a deployed stack: its TableName output names the table")
    admin.add_argument(
        "--endpoint-url",
        default=os.environ.get("AWS_ENDPOINT_URL"),
        help="DynamoDB endpoint (a local stack's moto)",
    )
    keys = commands.add_parser("keys", help="create, revoke and list API keys").add_subparsers(
        dest="action", required=True
    )
    create = keys.add_parser("create", parents=[admin], help="a new API key for an account")
    create.add_argument("--account", required=True)
    create.add_argument("--name", help="a label for the key")
    revoke = keys.add_parser("revoke", parents=[admin], help="revoke a key by id (key_...) or by the key")
    revoke.add_argument("key")
    listing = keys.add_parser("list", parents=[admin], help="an account's keys")
    listing.add_argument("--account", required=True)
    for parser_ in (create, revoke, listing):
        parser_.set_defaults(run=cmd_keys)
    account_commands = commands.add_parser("accounts", help="account settings").add_subparsers(
        dest="action", required=True
    )
    show = account_commands.add_parser("show", parents=[admin], help="an account's settings")
    show.add_argument("account")
    configure = account_commands.add_parser("set", parents=[admin], help="change an account's settings")
    configure.add_argument("account")
    configure.add_argument(
        "--allow-bucket",
        action="append",
        metavar="s3://NAME|cos://NAME",
        help="replace the bucket allowlist (repeat for several)",
    )
    configure.add_argument("--max-active-batches", type=int)
    configure.add_argument("--max-creates-per-minute", type=int)
    for parser_ in (show, configure):
        parser_.set_defaults(run=cmd_accounts)
    redrive = commands.add_parser("redrive", help="move a dead-letter queue's messages back to their queue")
    redrive.add_argument("dlq_url", help="the dead-letter queue's URL")
    redrive.add_argument(
        "--to", required=True, dest="target_url", help="the URL of the queue to move them to"
    )
    redrive.add_argument("--max", type=int, dest="limit", help="at most this many messages")
    redrive.add_argument(
        "--endpoint-url",
        default=os.environ.get("AWS_ENDPOINT_URL"),
        help="SQS endpoint (a local stack's moto)",
    )
    redrive.set_defaults(run=cmd_redrive)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
