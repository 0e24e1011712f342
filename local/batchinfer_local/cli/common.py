"""What every `batchinfer` command shares: the consoles, one-line errors, output and the global options."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from rich.console import Console

from batchinfer_local.client import ApiError, BatchClient, Unreachable

console = Console(highlight=False, soft_wrap=True)
errors = Console(stderr=True, highlight=False, soft_wrap=True)
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"

# What to do about an API error, by HTTP status (404s and 5xx are told apart in `describe_api_error`).
_HINTS = {
    401: "set BATCHINFER_API_KEY or pass --api-key (`batchinfer local` prints the local stack's key)",
    403: "this key's account may not do that (bucket allowlist: `batchinfer accounts set ID --allow-bucket`)",
    413: "send files over 6 MB through /v1/uploads (`batchinfer submit` does so by itself)",
    429: "over a limit of your account: wait and retry (`batchinfer accounts show ID` shows its limits)",
}

Run = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """A failure the CLI reports as one line (`message`) with exit code `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


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
    """One line: the URL that did not answer, why, and how to start or point at a stack."""
    return (
        f"error: cannot reach {base_url} ({error.reason}): start the local stack (`make local`) or point "
        "--base-url / BATCHINFER_BASE_URL at a deployed stack's ApiUrl followed by v1"
    )


def client_of(args: argparse.Namespace) -> BatchClient:
    """The API client of `--base-url` and `--api-key`."""
    return BatchClient(args.base_url, args.api_key)


def emit(args: argparse.Namespace, value: Any, text: Callable[[], None]) -> None:
    """Print `value` as JSON with --json, else call `text` (which prints the human form)."""
    if args.json:
        print(json.dumps(value))
    else:
        text()


def emit_page(
    args: argparse.Namespace, page: dict[str, Any], row: Callable[[dict[str, Any]], str], empty: str
) -> None:
    """Print a list page (`{"data": [...]}`): its JSON with --json, else one `row` per item or `empty`."""

    def text() -> None:
        for item in page["data"]:
            console.print(row(item))
        if not page["data"]:
            console.print(empty)

    emit(args, page, text)


def date(epoch: int | float | None) -> str:
    """Unix seconds as `YYYY-MM-DD HH:MM:SS UTC`; "-" for None."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
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


class Commands:
    """The `batchinfer` subcommands: each command module's `register` adds its own through `add`."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._subparsers = parser.add_subparsers(dest="command", required=True)

    def add(self, name: str, run: Run | None, help_: str, **kwargs: Any) -> argparse.ArgumentParser:
        """A command `name` (with the global options) that runs `run(args)`; None for a group whose
        actions set their own `run`."""
        sub = self._subparsers.add_parser(name, help=help_, **kwargs)
        global_options(sub, defaults=False)
        if run is not None:
            sub.set_defaults(run=run)
        return sub
