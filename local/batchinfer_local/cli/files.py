"""`batchinfer files list|delete`: your files."""

from __future__ import annotations

import argparse

from batchinfer_local.cli.common import Commands, client_of, console, date, emit, emit_page, global_options


def register(commands: Commands) -> None:
    """Add `files list` and `files delete`."""
    actions = commands.add("files", cmd_files, "list or delete your files").add_subparsers(
        dest="action", required=True
    )
    listing = actions.add_parser("list", help="your files, newest first")
    listing.add_argument("--purpose", help="only this purpose (batch, batch_output)")
    listing.add_argument("--limit", type=int, default=100)
    delete = actions.add_parser("delete", help="delete a file")
    delete.add_argument("file_id")
    for sub in (listing, delete):
        global_options(sub, defaults=False)


def cmd_files(args: argparse.Namespace) -> int:
    """List your files (one line each) or delete one."""
    client = client_of(args)
    if args.action == "delete":
        deleted = client.delete_file(args.file_id)
        emit(args, deleted, lambda: console.print(f"deleted {deleted['id']}"))
        return 0
    page = client.files(purpose=args.purpose, limit=args.limit)
    emit_page(
        args,
        page,
        lambda item: (
            f"{item['id']}  {item.get('purpose', ''):<12}  {item.get('bytes', 0):>10} bytes  "
            f"created {date(item.get('created_at'))}  {item.get('filename', '')}"
        ),
        "no files",
    )
    return 0
