"""Steering a batch: `retry` (a new batch from an ended batch's failed lines), and what `download
--merged`, `download --partial` and `submit --dry-run` do."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from batchinfer.core.ids import retry_batch_id
from batchinfer_local.cli.common import CliError, Commands, client_of, console, emit
from batchinfer_local.client import TERMINAL, ApiError, BatchClient

NEWLINE = b"\n"


def register(commands: Commands) -> None:
    """Add the `retry` command."""
    retry = commands.add(
        "retry", cmd_retry, "run an ended batch's failed (and unrun) lines again, as a new batch"
    )
    retry.add_argument("batch_id")


def cmd_retry(args: argparse.Namespace) -> int:
    """Create (or find: it is created once) the retry of the batch; its id and size."""
    batch = client_of(args).retry(args.batch_id)
    total = (batch.get("request_counts") or {}).get("total")
    emit(
        args,
        batch,
        lambda: console.print(
            f"batch [bold]{batch['id']}[/] retries {args.batch_id}: {batch['status']}"
            + (f", {total} requests" if total else "")
            + f" (`batchinfer wait {batch['id']}`, then `batchinfer download {args.batch_id} --merged`)"
        ),
    )
    return 0


def result_bytes(client: BatchClient, batch: dict[str, Any], kind: str) -> bytes | None:
    """The batch's `output` or `error` file (None: it has none): by file id, or for a TokenHub batch
    (its ids are s3:// / cos:// paths) from its presigned `*_file_url`."""
    file_id, url = batch.get(f"{kind}_file_id"), batch.get(f"{kind}_file_url")
    if not file_id:
        return None
    if "://" not in file_id:
        return client.content(file_id)
    if not url:
        raise CliError(f"error: batch {batch['id']} has {kind} at {file_id} but no {kind}_file_url")
    return client.fetch_url(url)


def retries(client: BatchClient, batch_id: str) -> list[dict[str, Any]]:
    """The ended retries of `batch_id`, each retrying the one before (`POST /v1/batches/{id}/retry`
    gives a batch one retry, whose id derives from the batch's); a retry still running ends the chain."""
    found = []
    while True:
        try:
            batch = client.retrieve(retry_batch_id(batch_id))
        except ApiError as error:
            if error.status == 404:
                return found
            raise
        if batch["status"] not in TERMINAL:
            return found
        found.append(batch)
        batch_id = batch["id"]


def merged(client: BatchClient, batch: dict[str, Any]) -> tuple[bytes, int]:
    """One result line per custom_id across `batch` and its ended retries: each custom_id's latest
    line (a retry's answer or error replaces the earlier one), in the order the custom_ids first
    appear (the original's output lines, then its error lines); and how many retries were merged."""
    chain = [batch, *retries(client, batch["id"])]
    latest: dict[str, bytes] = {}
    for each in chain:
        for kind in ("output", "error"):
            for line in (result_bytes(client, each, kind) or b"").splitlines():
                if line.strip():
                    latest[json.loads(line)["custom_id"]] = line
    return b"".join(line + NEWLINE for line in latest.values()), len(chain) - 1


def write_merged(client: BatchClient, batch: dict[str, Any], out: Path, args: argparse.Namespace) -> Path:
    """Write `merged.jsonl` of the ended `batch` and its retries into `out`; its path."""
    data, merged_retries = merged(client, batch)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "merged.jsonl"
    path.write_bytes(data)
    if not args.json:
        console.print(f"wrote {path} ({data.count(NEWLINE)} lines, {merged_retries} retries merged)")
    return path


def write_partial(client: BatchClient, batch_id: str, out: Path, args: argparse.Namespace) -> Path:
    """Write the output lines committed so far (`partial-output.jsonl`, in input order as far as
    complete: each line as the final output.jsonl will hold it) into `out`; its path."""
    out.mkdir(parents=True, exist_ok=True)
    path, after, complete = out / "partial-output.jsonl", 0, False
    with path.open("wb") as sink:
        more = True
        while more:
            data, after, more, complete = client.output_page(batch_id, after)
            sink.write(data)
    if not args.json:
        state = "all of its output" if complete else "the output so far"
        console.print(f"wrote {path} ({after} lines: {state})")
    return path


def print_estimate(estimate: dict[str, Any]) -> None:
    """`submit --dry-run`'s report: the file's errors, or its counts, tokens and estimated cost."""
    errors = (estimate.get("errors") or {}).get("data") or []
    counts, tokens = estimate.get("request_counts") or {}, estimate.get("usage") or {}
    console.print(
        f"dry run of {estimate.get('input_file_id')}: {'valid' if estimate.get('valid') else 'invalid'}, "
        f"{counts.get('total', 0)} requests, model {estimate.get('model') or '-'}",
        markup=False,
    )
    for error in errors:
        where = f"line {error['line']}: " if error.get("line") else ""
        console.print(f"  {where}{error.get('code')}: {error.get('message')}", markup=False)
    if estimate.get("valid"):
        cost = estimate.get("estimated_cost") or {}
        amount = cost.get("total")
        console.print(
            f"tokens: {tokens.get('input_tokens', 0)} input ({tokens.get('input_tokens_method')}), "
            f"{tokens.get('output_tokens', 0)} output at most; estimated cost: "
            + (f"{amount} {cost.get('currency')}" if amount is not None else "no price set for this model"),
            markup=False,
        )


def dry_run(client: BatchClient, path: Path, endpoint: str, args: argparse.Namespace) -> int:
    """Upload `path` and ask for its dry run (nothing is queued); exit 1 when the file is invalid."""
    uploaded = client.upload(path)
    estimate = client.dry_run(uploaded["id"], endpoint=endpoint, completion_window=args.completion_window)
    emit(args, estimate, lambda: print_estimate(estimate))
    return 0 if estimate.get("valid") else 1


def check_ended(batch: dict[str, Any]) -> None:
    """Raise CliError unless `batch` has ended (its result files are final)."""
    if batch["status"] not in TERMINAL:
        raise CliError(
            f"error: batch {batch['id']} is {batch['status']}: nothing to download yet "
            f"(`batchinfer wait {batch['id']}` waits for it; `--partial` downloads what is done)"
        )
