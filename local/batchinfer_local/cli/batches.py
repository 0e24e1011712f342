"""The batch commands: `submit`, `status`, `wait`, `list`, `cancel` and `download`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from batchinfer.wire.status import BatchStatus
from batchinfer_local.cli.common import CliError, Commands, client_of, console, date, emit, emit_page, errors
from batchinfer_local.cli.progress import follow
from batchinfer_local.cli.steering import check_ended, dry_run, result_bytes, write_merged, write_partial
from batchinfer_local.client import BatchClient

# How `wait` says a batch ended other than completed.
_ENDINGS = {
    BatchStatus.FAILED: "failed",
    BatchStatus.EXPIRED: "expired",
    BatchStatus.CANCELLED: "was cancelled",
}
# `--dialect`: OpenAI's batch input file, or Anthropic's Message Batch requests (`/v1/messages/batches`).
DIALECTS = ("openai", "anthropic")
NEWLINE = b"\n"
# The Batch object's timestamp of each way a batch ends.
_ENDED_AT = {
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.FAILED: "failed_at",
    BatchStatus.EXPIRED: "expired_at",
    BatchStatus.CANCELLED: "cancelled_at",
}


def register(commands: Commands) -> None:
    """Add the batch commands."""
    submit = commands.add("submit", cmd_submit, "upload a JSONL file and create a batch")
    submit.add_argument("file")
    submit.add_argument("--wait", action="store_true", help="show progress until the batch ends")
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="check the file and estimate its tokens and cost; no batch is created (exit 1: invalid)",
    )
    submit.add_argument("-o", "--output", help="with --wait: download the result files into this directory")
    submit.add_argument(
        "--endpoint", help="default: the url of the file's lines (/v1/chat/completions when it has none)"
    )
    submit.add_argument(
        "--dialect",
        choices=DIALECTS,
        default="openai",
        help="anthropic: FILE holds Message Batch requests, one {custom_id, params} per line",
    )
    submit.add_argument("--completion-window", default="24h", help="whole hours, 1h to 168h")
    submit.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="repeat for several")
    submit.add_argument(
        "--output-expires-after",
        type=int,
        metavar="SECONDS",
        help="delete the result files this long after creation (3600 to 2592000)",
    )
    status = commands.add("status", cmd_status, "a batch in short (--json: the Batch object)")
    status.add_argument("batch_id")
    status.add_argument("--watch", action="store_true", help="a progress bar until the batch ends")
    wait = commands.add("wait", cmd_wait, "a progress bar until the batch ends (exit 1 unless completed)")
    wait.add_argument("batch_id")
    listing = commands.add("list", cmd_list, "your batches, newest first")
    listing.add_argument("--limit", type=int, default=20)
    cancel = commands.add("cancel", cmd_cancel, "cancel a batch")
    cancel.add_argument("batch_id")
    download = commands.add("download", cmd_download, "download a batch's result files")
    download.add_argument("batch_id")
    download.add_argument("-o", "--output", default=".")
    download.add_argument(
        "--dialect", choices=DIALECTS, default="openai", help="anthropic: the Message Batch's results.jsonl"
    )
    which = download.add_mutually_exclusive_group()
    which.add_argument(
        "--merged",
        action="store_true",
        help="merged.jsonl: each custom_id's latest line across the batch and its retries",
    )
    which.add_argument(
        "--partial",
        action="store_true",
        help="partial-output.jsonl: the output lines done so far, while the batch runs",
    )


def metadata(pairs: list[str] | None) -> dict[str, str] | None:
    """`--metadata KEY=VALUE` options as a dict (None when none).

    Raises:
        CliError: a pair without `=` or with an empty key (exit code 2).
    """
    if not pairs:
        return None
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"error: --metadata {pair!r} is not KEY=VALUE", code=2)
        found[key] = value
    return found


def file_endpoint(path: Path) -> str:
    """The endpoint of a batch file: the one `url` its request lines name (lines that are not JSON
    objects, or have no string url, are left to the server's validation); `/v1/chat/completions`
    when none names one.

    Raises:
        CliError: the lines name several urls (exit code 2), saying which line first names each.
    """
    first: dict[str, int] = {}
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                url = json.loads(line).get("url") if line.strip() else None
            except (ValueError, AttributeError):
                continue
            if isinstance(url, str):
                first.setdefault(url, number)
    if len(first) > 1:
        named = ", ".join(f"{url} (line {number})" for url, number in first.items())
        raise CliError(
            f"error: {path} mixes urls: {named}; a batch has one endpoint: split the file, or give "
            "--endpoint to have the other lines reported",
            code=2,
        )
    return next(iter(first), "/v1/chat/completions")


def counts(batch: dict[str, Any]) -> str:
    """`completed/total done, failed failed` of a Batch object."""
    numbers = batch.get("request_counts") or {}
    return f"{numbers.get('completed', 0)}/{numbers.get('total', 0)} done, {numbers.get('failed', 0)} failed"


def status_lines(batch: dict[str, Any]) -> list[str]:
    """`batchinfer status`'s summary: id, status, endpoint and counts; when it was created and ended;
    then one line per batch error."""
    lines = [f"{batch['id']}: {batch['status']}, {batch.get('endpoint', '-')}, {counts(batch)}"]
    ended = batch.get(_ENDED_AT.get(batch["status"], ""))
    lines.append(f"created {date(batch.get('created_at'))}" + (f", ended {date(ended)}" if ended else ""))
    lines += [f"  {where}" for where in error_lines(batch)]
    return lines


def error_lines(batch: dict[str, Any]) -> list[str]:
    """One line per entry of the batch's `errors` (`line N: code: message`)."""
    found = []
    for error in (batch.get("errors") or {}).get("data") or []:
        where = f"line {error['line']}: " if error.get("line") else ""
        found.append(f"{where}{error.get('code')}: {error.get('message')}")
    return found


def ending_line(batch: dict[str, Any]) -> str:
    """One line for a batch that ended other than `completed`: how it ended, why (its first error, or
    its completion window for an expired one) and its counts."""
    status, reasons = batch["status"], error_lines(batch)
    what = _ENDINGS.get(status, f"ended {status}")
    why = None
    if reasons:
        why = reasons[0] + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else "")
    elif status == BatchStatus.EXPIRED:
        why = f"its completion window ({batch.get('completion_window', '-')}) passed"
    return f"error: batch {batch['id']} {what}" + (f": {why}" if why else "") + f" ({counts(batch)})"


def summary(batch: dict[str, Any]) -> None:
    """Print the last line of `submit --wait` and `wait`: status, counts and result files, then the
    batch's errors."""
    numbers = batch.get("request_counts") or {}
    console.print(
        f"batch {batch['id']}: [bold]{batch['status']}[/], "
        f"{numbers.get('completed', 0)}/{numbers.get('total', 0)} "
        f"completed, {numbers.get('failed', 0)} failed; output_file_id={batch.get('output_file_id')} "
        f"error_file_id={batch.get('error_file_id')}"
    )
    for line in error_lines(batch):
        console.print(f"  {line}")


def message_batch_requests(path: Path) -> list[dict[str, Any]]:
    """The Message Batch requests of a JSONL file, one `{"custom_id", "params"}` object per non-blank
    line. Raises CliError naming the first line that is not a JSON object."""
    requests = []
    for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as error:
            raise CliError(f"error: {path} line {number} is not JSON: {error.msg}", code=2) from None
        if not isinstance(request, dict):
            raise CliError(f'error: {path} line {number} is not a {{"custom_id", "params"}} object', code=2)
        requests.append(request)
    return requests


def _create(client: BatchClient, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Create the batch of `path` in `args.dialect`: the Batch object (for a Message Batch, the same
    batch as `/v1/batches` shows it)."""
    if args.dialect == "anthropic":
        created = client.create_message_batch(message_batch_requests(path))
        batch = client.retrieve(created["id"])
        size = path.stat().st_size
    else:
        uploaded = client.upload(path)
        batch = client.create(
            uploaded["id"],
            endpoint=args.endpoint or file_endpoint(path),
            completion_window=args.completion_window,
            metadata=metadata(args.metadata),
            output_expires_after=args.output_expires_after,
        )
        size = uploaded["bytes"]
    if not args.json:
        console.print(f"batch [bold]{batch['id']}[/] created from {path} ({size} bytes)")
    return batch


def cmd_submit(args: argparse.Namespace) -> int:
    """Upload the file and create a batch (`--dialect anthropic`: a Message Batch of its requests);
    with --wait follow it (exit 1 unless it completed)."""
    client, path = client_of(args), Path(args.file)
    if not path.is_file():
        raise CliError(f"error: no such file: {path}: give the path of a JSONL batch file", code=2)
    if args.dry_run and args.dialect == "openai":
        return dry_run(client, path, args.endpoint or file_endpoint(path), args)
    if args.dry_run:
        raise CliError("error: --dry-run checks OpenAI batch files (--dialect openai)", code=2)
    batch = _create(client, path, args)
    if not args.wait:
        emit(args, batch, lambda: None)
        return 0
    batch = follow(client, batch["id"], show=not args.json)
    if args.output:
        download_results(client, batch, Path(args.output), args)
    emit(args, batch, lambda: summary(batch))
    return 0 if batch["status"] == BatchStatus.COMPLETED else 1


def cmd_status(args: argparse.Namespace) -> int:
    """The batch in a few lines (--json: the Batch object); --watch: as `wait`."""
    if args.watch:
        return cmd_wait(args)
    batch = client_of(args).retrieve(args.batch_id)
    emit(args, batch, lambda: console.print("\n".join(status_lines(batch)), markup=False))
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    """Follow the batch until it ends; one line on stderr and exit 1 unless it completed."""
    batch = follow(client_of(args), args.batch_id, show=not args.json)
    emit(args, batch, lambda: summary(batch))
    if batch["status"] == BatchStatus.COMPLETED:
        return 0
    errors.print(ending_line(batch), markup=False)
    return 1


def cmd_list(args: argparse.Namespace) -> int:
    """Your batches, newest first: one line each."""

    def row(batch: dict[str, Any]) -> str:
        return (
            f"{batch['id']}  {batch['status']:<10}  {counts(batch)}  created {date(batch.get('created_at'))}"
        )

    page = client_of(args).batches(limit=args.limit)
    emit_page(args, page, row, "no batches yet: `batchinfer submit FILE` creates one")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel the batch; its status after."""
    batch = client_of(args).cancel(args.batch_id)
    emit(args, batch, lambda: console.print(f"batch {batch['id']}: {batch['status']}"))
    return 0


def download_results(
    client: BatchClient, batch: dict[str, Any], out: Path, args: argparse.Namespace
) -> list[Path]:
    """Write the batch's output.jsonl / error.jsonl into `out`: by file id, or for a TokenHub batch
    (ids are s3:// / cos:// paths) from its presigned `*_file_url`; with `--dialect anthropic`, the
    Message Batch's results.jsonl. The paths written."""
    written = []
    out.mkdir(parents=True, exist_ok=True)
    if getattr(args, "dialect", "openai") == "anthropic":
        data = client.message_batch_results(batch["id"])
        path = out / "results.jsonl"
        path.write_bytes(data)
        if not args.json:
            console.print(f"wrote {path} ({data.count(NEWLINE)} lines)")
        return [path]
    for kind in ("output", "error"):
        data = result_bytes(client, batch, kind)
        if data is None:
            continue
        (out / f"{kind}.jsonl").write_bytes(data)
        written.append(out / f"{kind}.jsonl")
        if not args.json:
            lines = data.count(b"\n")
            console.print(f"wrote {out / f'{kind}.jsonl'} ({lines} lines)")
    return written


def cmd_download(args: argparse.Namespace) -> int:
    """Download an ended batch's result files (exit 1 for a failed batch or one without results);
    `--merged`: one file of it and its retries; `--partial`: the output done so far, while it runs."""
    client = client_of(args)
    if args.partial:
        path = write_partial(client, args.batch_id, Path(args.output), args)
        emit(args, {"batch_id": args.batch_id, "written": [str(path)]}, lambda: None)
        return 0
    batch = client.retrieve(args.batch_id)
    status = batch["status"]
    check_ended(batch)
    if args.merged:
        written = [write_merged(client, batch, Path(args.output), args)]
    else:
        written = download_results(client, batch, Path(args.output), args)
    emit(args, {"batch": batch, "written": [str(p) for p in written]}, lambda: None)
    if status == BatchStatus.FAILED:
        first = ((batch.get("errors") or {}).get("data") or [{}])[0]
        reason = f": {first.get('code')}: {first.get('message')}" if first.get("message") else ""
        raise CliError(
            f"error: batch {batch['id']} failed{reason} (`batchinfer status {batch['id']}` shows all)"
        )
    if not written:
        raise CliError(f"error: batch {batch['id']} is {status} and has no result files")
    return 0
