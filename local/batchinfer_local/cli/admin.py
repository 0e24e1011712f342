"""`batchinfer keys` and `batchinfer accounts`: API keys and account settings, written to the batch
table directly: with your AWS credentials (`--table` / `--stack-name`), or on the running local stack
as its admin (`--local`)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from batchinfer_local.cli.common import CliError, Commands, console, date, global_options
from batchinfer_local.cli.state import read_state


def admin_options() -> argparse.ArgumentParser:
    """The options naming the batch table (a parent parser of every keys/accounts action)."""
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
    global_options(admin, defaults=False)
    return admin


def register(commands: Commands) -> None:
    """Add `keys create|revoke|list` and `accounts show|set`."""
    admin = admin_options()
    keys = commands.add("keys", cmd_keys, "create, revoke and list API keys").add_subparsers(
        dest="action", required=True
    )
    create = keys.add_parser("create", parents=[admin], help="a new API key for an account")
    create.add_argument("--account", required=True)
    create.add_argument("--name", help="a label for the key")
    revoke = keys.add_parser("revoke", parents=[admin], help="revoke a key by id (key_...) or by the key")
    revoke.add_argument("key")
    keys_list = keys.add_parser("list", parents=[admin], help="an account's keys")
    keys_list.add_argument("--account", required=True)
    accounts = commands.add("accounts", cmd_accounts, "account settings").add_subparsers(
        dest="action", required=True
    )
    show = accounts.add_parser("show", parents=[admin], help="an account's settings")
    show.add_argument("account")
    configure = accounts.add_parser("set", parents=[admin], help="change an account's settings")
    configure.add_argument("account")
    configure.add_argument(
        "--allow-bucket",
        action="append",
        metavar="s3://NAME[/PREFIX]|cos://NAME[/PREFIX]",
        help="replace the bucket allowlist (repeat for several)",
    )
    configure.add_argument("--max-active-batches", type=int)
    configure.add_argument("--max-creates-per-minute", type=int)
    configure.add_argument("--max-storage-bytes", type=int, help="bytes of files and pending uploads")
    configure.add_argument("--max-stored-files", type=int, help="files and pending uploads")
    configure.add_argument("--max-pending-uploads", type=int)
    configure.add_argument("--max-upload-parts", type=int, help="parts of one upload")
    configure.add_argument(
        "--webhook-url",
        metavar="URL",
        help="send batch webhooks there, signed with a new secret it prints once ('' removes it)",
    )
    configure.add_argument(
        "--rotate-webhook-secret",
        action="store_true",
        help="a new webhook signing secret, printed once; the old one signs too for --webhook-grace",
    )
    configure.add_argument(
        "--webhook-grace",
        type=int,
        metavar="SECONDS",
        help="with --rotate-webhook-secret: how long the rotated-out secret still signs deliveries "
        "(default: a day, at most 30 days)",
    )


def batch_table(args: argparse.Namespace) -> Any:
    """The batch table: the local stack's (--local), the one named by --table / $BATCHINFER_TABLE, or
    by --stack-name's TableName output.

    Raises:
        CliError: no local stack is running (--local), or no table is named (exit code 2).
    """
    import boto3

    if args.local:
        state = read_state()
        return state.resource("dynamodb").Table(state.table)
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
    """Create a key (shown once), revoke one, or list an account's."""
    from batchinfer.data import accounts

    table = batch_table(args)
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
        state = f"revoked {date(key.revoked_at)}" if key.revoked_at else "active"
        console.print(f"{key.key_id}  created {date(key.created_at)}  {state}  {key.name or ''}")
    return 0


def _check_webhook_flags(args: argparse.Namespace) -> None:
    """Refuse webhook flags that would do nothing or something else than asked (CliError, exit 2):
    a grace without a rotation; a rotation beside a new URL, which starts over with one new secret."""
    if args.webhook_grace is not None and not args.rotate_webhook_secret:
        raise CliError("error: --webhook-grace goes with --rotate-webhook-secret", code=2)
    if args.rotate_webhook_secret and args.webhook_url is not None:
        raise CliError(
            "error: --webhook-url sets a new secret of its own; rotate with --rotate-webhook-secret alone",
            code=2,
        )


def _apply_settings(args: argparse.Namespace, table: Any) -> str | None:
    """Apply `accounts set`'s flags to `args.account`; the new webhook secret when one was made.
    Raises ValueError for a setting the account refuses."""
    from batchinfer.data import accounts
    from batchinfer.data.storage import QUOTA_FIELDS

    accounts.configure_account(
        args.account,
        allowed_buckets=args.allow_bucket,
        max_active_batches=args.max_active_batches,
        max_creates_per_minute=args.max_creates_per_minute,
        storage={field: getattr(args, field) for field in QUOTA_FIELDS},
        table=table,
    )
    if args.webhook_url is not None:
        # The CLI has no function's settings: loopback receivers as the stack it manages is told.
        loopback = os.environ.get("WEBHOOK_ALLOW_LOOPBACK", "").lower() in ("1", "true")
        return accounts.set_webhook(
            args.account, args.webhook_url or None, table=table, allow_loopback=loopback
        )
    if args.rotate_webhook_secret:
        grace = accounts.WEBHOOK_GRACE_S if args.webhook_grace is None else args.webhook_grace
        return accounts.rotate_webhook_secret(args.account, grace_seconds=grace, table=table)
    return None


def cmd_accounts(args: argparse.Namespace) -> int:
    """Show an account's settings, or change them (a new webhook secret is printed once)."""
    from batchinfer.data import accounts

    if args.action == "set":
        _check_webhook_flags(args)
    table = batch_table(args)
    secret = None
    if args.action == "set":
        try:
            secret = _apply_settings(args, table)
        except ValueError as error:
            raise CliError(f"error: {error}", code=2) from None
    account = accounts.get_account(args.account, table=table)
    shown = account.model_dump(mode="json", exclude={"webhook_secret", "webhook_previous_secret"})
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
