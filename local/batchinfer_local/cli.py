"""`batchinfer`: run the local stack, submit batches, follow them and fetch their results.

    batchinfer local [--port 8000] [--no-iam]     the whole pipeline on this machine, in the foreground
    batchinfer submit FILE [--wait] [-o DIR]      upload a JSONL file and create a batch
        [--endpoint E] [--completion-window 24h] [--metadata K=V ...] [--output-expires-after SECONDS]
    batchinfer status BATCH_ID [--watch]          the Batch object (--watch: a progress bar until it ends)
    batchinfer wait BATCH_ID                      a progress bar until the batch ends
    batchinfer list [--limit N]                   your batches, newest first
    batchinfer cancel BATCH_ID                    cancel a batch
    batchinfer download BATCH_ID [-o DIR]         output.jsonl and error.jsonl
    batchinfer files list|delete [FILE_ID]        your files
    batchinfer smoke [--second-api-key KEY]       the whole user flow against a stack, one line per step
    batchinfer demo FILE                          local stack + submit --wait + print answers, then stop
    batchinfer keys create|revoke|list ...        API keys (only their hash is stored)
    batchinfer accounts show|set ID ...           bucket allowlist, limit overrides, webhook URL

The client commands talk to `--base-url` (default `$BATCHINFER_BASE_URL`, else the local stack at
http://127.0.0.1:8000/v1) with `--api-key` (default `$BATCHINFER_API_KEY`); `--json` prints the API's
JSON instead of text. These options go before or after the command. The local stack's key is
`$BATCHINFER_DEV_API_KEY`, or one it generates and prints.

`keys` and `accounts` write the batch table directly with your AWS credentials: name it with
`--table` (default `$BATCHINFER_TABLE`) or `--stack-name` (its `TableName` output); `--local` uses the
running local stack's moto, table and admin identity instead (from the state file `batchinfer local`
writes).

Every failure is one line on stderr (the server's message, the HTTP status, what to do) and a
non-zero exit code: 1 for a failed request or batch, 2 for a usage error.
"""

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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from batchinfer_local import iam
from batchinfer_local.client import TERMINAL, ApiError, BatchClient, Unreachable

console = Console(highlight=False, soft_wrap=True)
errors = Console(stderr=True, highlight=False, soft_wrap=True)
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"

# Where `batchinfer local` leaves its moto endpoint, table and admin identity for `keys|accounts --local`.
STATE_ENV = "BATCHINFER_LOCAL_STATE"


class CliError(Exception):
    """A failure the CLI reports as one line (`message`) with exit code `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def state_path() -> Path:
    """The local stack's state file: `$BATCHINFER_LOCAL_STATE`, else ~/.cache/batchinfer/local.json."""
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".cache" / "batchinfer" / "local.json")


# ---------------------------------------------------------------------- one-line errors
_HINTS = {
    401: "set BATCHINFER_API_KEY or pass --api-key (`batchinfer local` prints the local stack's key)",
    403: "this key's account may not do that (bucket allowlist: `batchinfer accounts set ID --allow-bucket`)",
    413: "send files over 6 MB through /v1/uploads (`batchinfer submit` does so by itself)",
    429: "over a limit of your account: wait and retry (`batchinfer accounts show ID` shows its limits)",
}


def describe_api_error(error: ApiError) -> str:
    """One line: the server's message, `(HTTP status, code)`, and what to do about it."""
    code = f", {error.code}" if error.code else ""
    hint = _HINTS.get(error.status)
    if error.status == 404:
        if error.code == "batch_not_found":
            hint = "check the id: `batchinfer list` shows your batches"
        elif error.code == "file_not_found":
            hint = "check the id: `batchinfer files list` shows your files"
        elif not error.code:
            hint = "check --base-url: it is the API's URL ending in /v1"
    elif error.status >= 500:
        hint = "a server error: retry, and see the stack's logs if it persists"
    line = f"error: {error.message} (HTTP {error.status}{code})"
    return f"{line}: {hint}" if hint else line


def describe_unreachable(error: Unreachable, base_url: str) -> str:
    return (
        f"error: cannot reach {base_url} ({error.reason}): start the local stack (`make local`) or point "
        "--base-url / BATCHINFER_BASE_URL at a deployed stack's ApiUrl followed by v1"
    )


# ---------------------------------------------------------------------- progress
class Rates:
    """Requests/s, tokens/s and the ETA of a batch from the Batch objects polled over time.

    Rates are measured from the first poll that saw the batch `in_progress` (its counts then are the
    baseline), so time spent validating does not dilute them. Why not rich's own task speed: it
    knows only one count, and tokens/s needs `usage` too.
    """

    def __init__(self) -> None:
        self.start: tuple[float, int, int] | None = None
        self.last: tuple[float, int, int] | None = None

    @staticmethod
    def done(batch: dict[str, Any]) -> int:
        counts = batch.get("request_counts") or {}
        return int(counts.get("completed") or 0) + int(counts.get("failed") or 0)

    @staticmethod
    def tokens(batch: dict[str, Any]) -> int:
        usage = batch.get("usage") or {}
        return int(usage.get("total_tokens") or 0) or int(usage.get("input_tokens") or 0) + int(
            usage.get("output_tokens") or 0
        )

    def update(self, batch: dict[str, Any], now: float) -> dict[str, str]:
        """Fields for the progress line: `rps`, `tps` (one decimal, "-" before any rate) and `eta`
        (m:ss, "-" while unknown)."""
        sample = (now, self.done(batch), self.tokens(batch))
        if self.start is None and batch.get("status") != "validating":
            self.start = sample
        self.last = sample
        if self.start is None or now <= self.start[0] or sample[1] == self.start[1]:
            return {"rps": "-", "tps": "-", "eta": "-"}
        elapsed = now - self.start[0]
        rps = (sample[1] - self.start[1]) / elapsed
        tps = (sample[2] - self.start[2]) / elapsed
        total = int((batch.get("request_counts") or {}).get("total") or 0)
        remaining = max(total - sample[1], 0)
        eta = round(remaining / rps)
        return {"rps": f"{rps:.1f}", "tps": f"{tps:.1f}", "eta": f"{eta // 60}:{eta % 60:02d}"}


def progress_bar(target: Console) -> Progress:
    """The bar of `submit --wait`, `status --watch` and `wait`: status, done of total, failed,
    requests/s, tokens/s, ETA, elapsed."""
    return Progress(
        TextColumn("{task.fields[status]:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TextColumn("{task.fields[rps]} req/s"),
        TextColumn("{task.fields[tps]} tok/s"),
        TextColumn("ETA {task.fields[eta]}"),
        TimeElapsedColumn(),
        console=target,
    )


def follow(
    client: BatchClient,
    batch_id: str,
    *,
    show: bool,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Poll the batch until it is terminal, with the progress bar when `show`; the last Batch object."""
    if not show:
        return client.wait(batch_id, poll_s=poll_s)
    rates = Rates()
    with progress_bar(console) as progress:
        task = progress.add_task(
            "batch", total=None, status="validating", failed=0, rps="-", tps="-", eta="-"
        )

        def update(batch: dict[str, Any]) -> None:
            counts = batch.get("request_counts") or {}
            progress.update(
                task,
                total=counts.get("total") or None,
                completed=Rates.done(batch),
                status=batch["status"],
                failed=counts.get("failed") or 0,
                **rates.update(batch, clock()),
            )

        return client.wait(batch_id, poll_s=poll_s, on_update=update)


# ---------------------------------------------------------------------- output
def _emit(args: argparse.Namespace, value: Any, text: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(value))
    else:
        text()


def _summary(batch: dict[str, Any]) -> None:
    counts = batch.get("request_counts") or {}
    console.print(
        f"batch {batch['id']}: [bold]{batch['status']}[/], "
        f"{counts.get('completed', 0)}/{counts.get('total', 0)} "
        f"completed, {counts.get('failed', 0)} failed; output_file_id={batch.get('output_file_id')} "
        f"error_file_id={batch.get('error_file_id')}"
    )
    for error in (batch.get("errors") or {}).get("data") or []:
        where = f"line {error['line']}: " if error.get("line") else ""
        console.print(f"  {where}{error.get('code')}: {error.get('message')}")


def _date(epoch: int | float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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


# ---------------------------------------------------------------------- client commands
def _client(args: argparse.Namespace) -> BatchClient:
    return BatchClient(args.base_url, args.api_key)


def _metadata(pairs: list[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    metadata = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"error: --metadata {pair!r} is not KEY=VALUE", code=2)
        metadata[key] = value
    return metadata


def cmd_submit(args: argparse.Namespace) -> int:
    client, path = _client(args), Path(args.file)
    if not path.is_file():
        raise CliError(f"error: no such file: {path}: give the path of a JSONL batch file", code=2)
    uploaded = client.upload(path)
    batch = client.create(
        uploaded["id"],
        endpoint=args.endpoint,
        completion_window=args.completion_window,
        metadata=_metadata(args.metadata),
        output_expires_after=args.output_expires_after,
    )
    if not args.json:
        console.print(f"batch [bold]{batch['id']}[/] created from {path} ({uploaded['bytes']} bytes)")
    if not args.wait:
        _emit(args, batch, lambda: None)
        return 0
    batch = follow(client, batch["id"], show=not args.json)
    if args.output:
        _download(client, batch, Path(args.output), args)
    _emit(args, batch, lambda: _summary(batch))
    return 0 if batch["status"] == "completed" else 1


def cmd_status(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.watch:
        return cmd_wait(args)
    batch = client.retrieve(args.batch_id)
    _emit(args, batch, lambda: console.print_json(json.dumps(batch)))
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    batch = follow(_client(args), args.batch_id, show=not args.json)
    _emit(args, batch, lambda: _summary(batch))
    return 0 if batch["status"] == "completed" else 1


def cmd_list(args: argparse.Namespace) -> int:
    def row(batch: dict[str, Any]) -> str:
        counts = batch.get("request_counts") or {}
        return (
            f"{batch['id']}  {batch['status']:<10}  {counts.get('completed', 0)}/{counts.get('total', 0)}"
            f" done, {counts.get('failed', 0)} failed  created {_date(batch.get('created_at'))}"
        )

    page = _client(args).batches(limit=args.limit)
    _emit_page(args, page, row, "no batches yet: `batchinfer submit FILE` creates one")
    return 0


def _emit_page(
    args: argparse.Namespace, page: dict[str, Any], row: Callable[[dict[str, Any]], str], empty: str
) -> None:
    """Print a list page (`{"data": [...]}`): its JSON with --json, else one `row` per item or `empty`."""

    def text() -> None:
        for item in page["data"]:
            console.print(row(item))
        if not page["data"]:
            console.print(empty)

    _emit(args, page, text)


def cmd_cancel(args: argparse.Namespace) -> int:
    batch = _client(args).cancel(args.batch_id)
    _emit(args, batch, lambda: console.print(f"batch {batch['id']}: {batch['status']}"))
    return 0


def _download(client: BatchClient, batch: dict[str, Any], out: Path, args: argparse.Namespace) -> list[Path]:
    """Write the batch's output.jsonl / error.jsonl into `out`: by file id, or for a TokenHub batch
    (ids are s3:// / cos:// paths) from its presigned `*_file_url`."""
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for kind in ("output", "error"):
        file_id, url = batch.get(f"{kind}_file_id"), batch.get(f"{kind}_file_url")
        if not file_id:
            continue
        if "://" in file_id:
            if not url:
                raise CliError(f"error: batch {batch['id']} has {kind} at {file_id} but no {kind}_file_url")
            data = client.fetch_url(url)
        else:
            data = client.content(file_id)
        (out / f"{kind}.jsonl").write_bytes(data)
        written.append(out / f"{kind}.jsonl")
        if not args.json:
            lines = data.count(b"\n")
            console.print(f"wrote {out / f'{kind}.jsonl'} ({lines} lines)")
    return written


def cmd_download(args: argparse.Namespace) -> int:
    client = _client(args)
    batch = client.retrieve(args.batch_id)
    status = batch["status"]
    if status not in TERMINAL:
        raise CliError(
            f"error: batch {batch['id']} is {status}: nothing to download yet "
            f"(`batchinfer wait {batch['id']}` waits for it)"
        )
    written = _download(client, batch, Path(args.output), args)
    _emit(args, {"batch": batch, "written": [str(p) for p in written]}, lambda: None)
    if status == "failed":
        first = ((batch.get("errors") or {}).get("data") or [{}])[0]
        reason = f": {first.get('code')}: {first.get('message')}" if first.get("message") else ""
        raise CliError(
            f"error: batch {batch['id']} failed{reason} (`batchinfer status {batch['id']}` shows all)"
        )
    if not written:
        raise CliError(f"error: batch {batch['id']} is {status} and has no result files")
    return 0


def cmd_files(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.action == "delete":
        deleted = client.delete_file(args.file_id)
        _emit(args, deleted, lambda: console.print(f"deleted {deleted['id']}"))
        return 0
    page = client.files(purpose=args.purpose, limit=args.limit)
    _emit_page(
        args,
        page,
        lambda item: (
            f"{item['id']}  {item.get('purpose', ''):<12}  {item.get('bytes', 0):>10} bytes  "
            f"created {_date(item.get('created_at'))}  {item.get('filename', '')}"
        ),
        "no files",
    )
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    from batchinfer_local.smoke import StepResult, run_smoke

    def report(result: StepResult) -> None:
        if args.json:
            print(json.dumps(result.model_dump()), flush=True)
        else:
            colour = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}[result.outcome]
            console.print(f"[{colour}]{result.outcome}[/] {result.step:<14} {result.detail}")

    results = run_smoke(
        args.base_url,
        args.api_key,
        second_api_key=args.second_api_key,
        model=args.model,
        timeout_s=args.timeout,
        report=report,
    )
    return 1 if any(r.outcome == "FAIL" for r in results) else 0


# ---------------------------------------------------------------------- the local stack
class _FunctionLabel(logging.Formatter):
    """`[LogicalId] line`: the function a forwarded line came from (its logger is
    `batchinfer_local.function.<LogicalId>`), also for lines that are not Powertools JSON."""

    def format(self, record: logging.LogRecord) -> str:
        return f"[{record.name.rsplit('.', 1)[-1]}] {record.getMessage()}"


@contextmanager
def _show_function_logs(level: int) -> Iterator[None]:
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


def _start(stack: Any, port: int) -> None:
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


def write_state(stack: Any, path: Path) -> None:
    """Leave the running `stack`'s base URL, moto endpoint, region, table, bucket and admin identity
    (moto's `testing` pair, not an AWS credential) in `path`, for `keys|accounts --local`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "base_url": f"{stack.base_url}/v1",
        "moto_endpoint": stack.moto_endpoint,
        "region": stack.region,
        "table": stack.environment["TABLE_NAME"],
        "bucket": stack.buckets["DataBucket"],
        "access_key_id": iam.ADMIN.access_key_id,
        "secret_access_key": iam.ADMIN.secret_access_key,
    }
    path.write_text(json.dumps(state))


def cmd_local(args: argparse.Namespace) -> int:
    from batchinfer_local.stack import LocalStack

    with _show_function_logs(logging.INFO):
        return _run_local(args, LocalStack(port=args.port, iam=False if args.no_iam else None))


def _run_local(args: argparse.Namespace, stack: Any) -> int:
    from batchinfer_local.stack import DEV_ACCOUNT, DEV_API_KEY_ENV

    _start(stack, args.port)
    state = state_path()
    try:
        base = f"{stack.base_url}/v1"
        console.print(f"batchinfer local stack: base URL [bold]{base}[/] (Ctrl-C to stop)")
        console.print(_iam_line(stack))
        origin = (
            f"generated; set ${DEV_API_KEY_ENV} to choose it"
            if stack.api_key_generated
            else f"from ${DEV_API_KEY_ENV}"
        )
        console.print(f"API key (account {DEV_ACCOUNT!r}, {origin}): [bold]{stack.api_key}[/]")
        console.print(
            f"  in another shell: export BATCHINFER_API_KEY={stack.api_key} BATCHINFER_BASE_URL={base}"
        )
        bucket = stack.buckets["DataBucket"]
        console.print(f"data bucket: [bold]{bucket}[/] (inbox uploads: s3://{bucket}/inbox/<path>.jsonl)")
        write_state(stack, state)
        console.print(
            f"moto: {stack.moto_endpoint}, table {stack.environment['TABLE_NAME']}: "
            f"`batchinfer keys|accounts ... --local` use them (state in {state})"
        )
        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        try:
            stopped.wait()
        except KeyboardInterrupt:
            pass
    finally:
        state.unlink(missing_ok=True)
        stack.stop()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from batchinfer_local.stack import LocalStack

    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"error: no such file: {path}", code=2)
    with _show_function_logs(logging.WARNING):  # the progress bar, not the handlers' logs
        return _run_demo(path, args, LocalStack(port=args.port, iam=False if args.no_iam else None))


def _run_demo(path: Path, args: argparse.Namespace, stack: Any) -> int:
    _start(stack, args.port)
    try:
        console.print(f"local stack up at {stack.base_url}/v1 (moto on {stack.moto_endpoint})")
        console.print(_iam_line(stack))
        client = BatchClient(f"{stack.base_url}/v1", stack.api_key)
        uploaded = client.upload(path)
        batch = client.create(uploaded["id"])
        console.print(f"batch [bold]{batch['id']}[/] created from {path} ({uploaded['bytes']} bytes)")
        batch = follow(client, batch["id"], show=True)
        print_answers(client, batch)
        _summary(batch)
    finally:
        stack.stop()
    return 0 if batch["status"] == "completed" else 1


# ---------------------------------------------------------------------- admin (the table itself)
def _table(args: argparse.Namespace) -> Any:
    """The batch table: the local stack's (--local), the one named by --table / $BATCHINFER_TABLE, or
    by --stack-name's TableName output."""
    import boto3

    if args.local:
        path = state_path()
        if not path.is_file():
            raise CliError(f"error: no local stack is running (no {path}): start one with `make local`")
        state = json.loads(path.read_text())
        session = boto3.session.Session(
            aws_access_key_id=state["access_key_id"],
            aws_secret_access_key=state["secret_access_key"],
            region_name=state["region"],
        )
        return session.resource("dynamodb", endpoint_url=state["moto_endpoint"]).Table(state["table"])
    session = boto3.session.Session()
    name = args.table
    if not name and args.stack_name:
        stack = session.client("cloudformation").describe_stacks(StackName=args.stack_name)["Stacks"][0]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        name = outputs.get("TableName")
    if not name:
        raise CliError(
            "error: name the batch table with --table (or $BATCHINFER_TABLE) or --stack-name, "
            "or use --local for the running local stack",
            code=2,
        )
    return session.resource("dynamodb", endpoint_url=args.endpoint_url).Table(name)


def cmd_keys(args: argparse.Namespace) -> int:
    from batchinfer.data import accounts

    table = _table(args)
    if args.action == "create":
        secret, key = accounts.create_key(args.account, name=args.name, table=table)
        if args.json:
            print(json.dumps({"key_id": key.key_id, "account_id": key.account_id, "key": secret}))
            return 0
        console.print(f"key {key.key_id} for account {key.account_id!r} (shown once, store it now):")
        print(secret)
        return 0
    if args.action == "revoke":
        revoked = accounts.revoke_key(args.key, table=table)
        if revoked is None:
            raise CliError(f"error: no such key: {args.key} (`batchinfer keys list --account ID` lists them)")
        console.print(f"revoked {revoked.key_id} of account {revoked.account_id!r}")
        return 0
    keys = accounts.list_keys(args.account, table=table)
    if args.json:
        print(json.dumps([key.model_dump(mode="json", exclude={"key_hash"}) for key in keys]))
        return 0
    for key in keys:
        state = f"revoked {_date(key.revoked_at)}" if key.revoked_at else "active"
        console.print(f"{key.key_id}  created {_date(key.created_at)}  {state}  {key.name or ''}")
    return 0


def cmd_accounts(args: argparse.Namespace) -> int:
    from batchinfer.data import accounts

    table = _table(args)
    secret = None
    if args.action == "set":
        try:
            account = accounts.configure_account(
                args.account,
                allowed_buckets=args.allow_bucket,
                max_active_batches=args.max_active_batches,
                max_creates_per_minute=args.max_creates_per_minute,
                table=table,
            )
            if args.webhook_url is not None:
                secret = accounts.set_webhook(args.account, args.webhook_url or None, table=table)
                account = accounts.get_account(args.account, table=table)
        except ValueError as error:
            raise CliError(f"error: {error}", code=2) from None
    else:
        account = accounts.get_account(args.account, table=table)
    shown = account.model_dump(mode="json", exclude={"webhook_secret"})
    if secret:
        # Shown this once: the receiver verifies deliveries with it (Standard Webhooks).
        shown["webhook_secret"] = secret
    if args.json:
        print(json.dumps(shown))
        return 0
    console.print_json(data=shown)
    if secret:
        console.print(f"webhook signing secret (shown once, keep it): {secret}", soft_wrap=True)
    return 0


def cmd_redrive(args: argparse.Namespace) -> int:
    import boto3

    from batchinfer_local.redrive import redrive

    moved = redrive(
        boto3.client("sqs", endpoint_url=args.endpoint_url), args.dlq_url, args.target_url, limit=args.limit
    )
    console.print(f"moved {moved} message(s) to {args.target_url}")
    return 0


# ---------------------------------------------------------------------- arguments
def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """--base-url, --api-key and --json, on the top parser (with defaults) and on every command
    (without, so that a value given before the command is kept): accepted before or after it."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--base-url",
        default=default(os.environ.get("BATCHINFER_BASE_URL", DEFAULT_BASE_URL)),
        help="the API's URL, ending in /v1 (default $BATCHINFER_BASE_URL, else the local stack)",
    )
    parser.add_argument(
        "--api-key", default=default(os.environ.get("BATCHINFER_API_KEY")), help="default $BATCHINFER_API_KEY"
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print the API's JSON (for scripts)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The `batchinfer` argument parser (every command's options)."""
    parser = argparse.ArgumentParser(
        prog="batchinfer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _global_options(parser, defaults=True)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, run: Callable[[argparse.Namespace], int], help_: str, **kwargs: Any) -> Any:
        sub = commands.add_parser(name, help=help_, **kwargs)
        _global_options(sub, defaults=False)
        sub.set_defaults(run=run)
        return sub

    local = command("local", cmd_local, "run the whole pipeline locally")
    local.add_argument("--port", type=int, default=int(os.environ.get("BATCHINFER_PORT", "8000")))
    local.add_argument(
        "--no-iam",
        action="store_true",
        help="don't enforce IAM (for debugging; also BATCHINFER_LOCAL_IAM=off)",
    )
    submit = command("submit", cmd_submit, "upload a JSONL file and create a batch")
    submit.add_argument("file")
    submit.add_argument("--wait", action="store_true", help="show progress until the batch ends")
    submit.add_argument("-o", "--output", help="with --wait: download the result files into this directory")
    submit.add_argument("--endpoint", default="/v1/chat/completions")
    submit.add_argument("--completion-window", default="24h", help="whole hours, 1h to 168h")
    submit.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="repeat for several")
    submit.add_argument(
        "--output-expires-after",
        type=int,
        metavar="SECONDS",
        help="delete the result files this long after creation (3600 to 2592000)",
    )
    status = command("status", cmd_status, "print a batch")
    status.add_argument("batch_id")
    status.add_argument("--watch", action="store_true", help="a progress bar until the batch ends")
    wait = command("wait", cmd_wait, "a progress bar until the batch ends")
    wait.add_argument("batch_id")
    listing = command("list", cmd_list, "your batches, newest first")
    listing.add_argument("--limit", type=int, default=20)
    cancel = command("cancel", cmd_cancel, "cancel a batch")
    cancel.add_argument("batch_id")
    download = command("download", cmd_download, "download a batch's result files")
    download.add_argument("batch_id")
    download.add_argument("-o", "--output", default=".")
    files = command("files", cmd_files, "list or delete your files")
    files_actions = files.add_subparsers(dest="action", required=True)
    files_list = files_actions.add_parser("list", help="your files, newest first")
    files_list.add_argument("--purpose", help="only this purpose (batch, batch_output)")
    files_list.add_argument("--limit", type=int, default=100)
    files_delete = files_actions.add_parser("delete", help="delete a file")
    files_delete.add_argument("file_id")
    for sub in (files_list, files_delete):
        _global_options(sub, defaults=False)
    smoke = command("smoke", cmd_smoke, "run the whole user flow against a stack, one line per step")
    smoke.add_argument("--second-api-key", help="a key of another account: probes that it sees nothing")
    smoke.add_argument("--model", help="the model of the test batch (default: the first of GET /v1/models)")
    smoke.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each batch")
    demo = command("demo", cmd_demo, "local stack + a sample batch, answers printed")
    demo.add_argument("file")
    demo.add_argument("--port", type=int, default=0, help="0: any free port")
    demo.add_argument(
        "--no-iam", action="store_true", help="don't enforce IAM (also BATCHINFER_LOCAL_IAM=off)"
    )

    admin = argparse.ArgumentParser(add_help=False)
    admin.add_argument("--table", default=os.environ.get("BATCHINFER_TABLE"), help="the batch table's name")
    admin.add_argument("--stack-name", help="a deployed stack: its TableName output names the table")
    admin.add_argument(
        "--endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL"), help="DynamoDB endpoint (e.g. a moto)"
    )
    admin.add_argument(
        "--local",
        action="store_true",
        help="the running local stack's table, as its admin (no AWS credentials)",
    )
    _global_options(admin, defaults=False)
    keys = command("keys", cmd_keys, "create, revoke and list API keys").add_subparsers(
        dest="action", required=True
    )
    create = keys.add_parser("create", parents=[admin], help="a new API key for an account")
    create.add_argument("--account", required=True)
    create.add_argument("--name", help="a label for the key")
    revoke = keys.add_parser("revoke", parents=[admin], help="revoke a key by id (key_...) or by the key")
    revoke.add_argument("key")
    keys_list = keys.add_parser("list", parents=[admin], help="an account's keys")
    keys_list.add_argument("--account", required=True)
    account_commands = command("accounts", cmd_accounts, "account settings").add_subparsers(
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
    configure.add_argument(
        "--webhook-url",
        metavar="URL",
        help="send batch webhooks there, signed with a new secret it prints once ('' removes it)",
    )
    redrive = command("redrive", cmd_redrive, "move a dead-letter queue's messages back to their queue")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one `batchinfer` command; its exit code (0 ok, 1 a failed request or batch, 2 a usage error).

    Every failure is one line on stderr, never a traceback: the API's own message with its HTTP
    status and what to do, an unreachable stack, a missing file, a port in use, missing AWS settings.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except CliError as error:
        errors.print(str(error))
        return error.code
    except ApiError as error:
        errors.print(describe_api_error(error))
        return 1
    except Unreachable as error:
        errors.print(describe_unreachable(error, args.base_url))
        return 1
    except (BotoCoreError, ClientError) as error:
        errors.print(
            f"error: AWS: {error}: set AWS credentials and a region (`aws configure`), "
            "or add --local for the running local stack"
        )
        return 1
    except FileNotFoundError as error:
        errors.print(f"error: no such file: {error.filename}")
        return 2
    except TimeoutError as error:
        errors.print(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        errors.print("interrupted (the batch goes on: `batchinfer status ID`)")
        return 130


if __name__ == "__main__":
    sys.exit(main())
