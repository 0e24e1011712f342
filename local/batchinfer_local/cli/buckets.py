"""`batchinfer buckets create NAME --local`: a TokenHub user bucket on the running local stack, in one step.

TokenHub batches read and write `s3://` paths in the user's own buckets. A bucket is usable when its
name matches the stack's UserBucketPattern (the functions' IAM policies name only those) and it is on
the account's bucket allowlist; locally it must also exist in the stack's S3 (moto). This command
does all three with the stack's admin identity (from the state file `batchinfer local` writes).
"""

from __future__ import annotations

import argparse
import json
from fnmatch import fnmatchcase
from typing import Any

from batchinfer_local.cli.common import CliError, Commands, console, global_options
from batchinfer_local.cli.state import LocalState, read_state


def register(commands: Commands) -> None:
    """Add `buckets create`."""
    actions = commands.add("buckets", cmd_buckets, "TokenHub user buckets on the local stack").add_subparsers(
        dest="action", required=True
    )
    create = actions.add_parser(
        "create",
        help="create bucket NAME in the local stack's S3 and allow it for an account (needs --local)",
    )
    create.add_argument("name", metavar="NAME", help="the bucket's name (it must match UserBucketPattern)")
    create.add_argument(
        "--local", action="store_true", help="on the running local stack, as its admin (no AWS credentials)"
    )
    create.add_argument("--account", help="the account allowed to use it (default: the local dev key's)")
    global_options(create, defaults=False)


def matches_pattern(name: str, pattern: str) -> bool:
    """Whether bucket `name` matches an IAM-style wildcard `pattern` (`*` any run, `?` one character)."""
    return fnmatchcase(name, pattern)


def cmd_buckets(args: argparse.Namespace) -> int:
    """Create the bucket (an existing one of the stack is kept) and add `s3://NAME` to the account's
    bucket allowlist.

    Raises:
        CliError: without --local or for a name outside UserBucketPattern (exit code 2); no local stack.
    """
    if not args.local:
        raise CliError(
            "error: `buckets create` sets up a bucket on the local stack: add --local (on AWS, create the "
            "bucket yourself and allow it with `batchinfer accounts set ID --allow-bucket s3://NAME`)",
            code=2,
        )
    state = read_state()
    if not matches_pattern(args.name, state.user_bucket_pattern):
        raise CliError(
            f"error: bucket {args.name!r} does not match the stack's user bucket pattern "
            f"{state.user_bucket_pattern!r} (template parameter UserBucketPattern): choose a name like "
            f"{state.user_bucket_pattern.replace('*', 'mine')!r}",
            code=2,
        )
    created = _create_bucket(state, args.name)
    account = args.account or state.dev_account
    allowed = _allow(state, account, f"s3://{args.name}")
    shown = {"bucket": args.name, "created": created, "account_id": account, "allowed_buckets": allowed}
    if args.json:
        print(json.dumps(shown))
        return 0
    made = "created" if created else "already exists"
    console.print(f"bucket s3://{args.name} {made} in the local stack's S3 ({state.moto_endpoint})")
    console.print(f"account {account!r} may use it: allowed buckets {', '.join(allowed)}", markup=False)
    return 0


def _create_bucket(state: LocalState, name: str) -> bool:
    """Create bucket `name` in the stack's S3; False when the stack already has it."""
    from botocore.exceptions import ClientError

    s3: Any = state.client("s3")
    try:
        s3.head_bucket(Bucket=name)
        return False
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
            raise
    if state.region == "us-east-1":
        s3.create_bucket(Bucket=name)
    else:
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": state.region})
    return True


def _allow(state: LocalState, account: str, bucket: str) -> list[str]:
    """Add `bucket` to the account's allowlist (the others kept); the allowlist after."""
    from batchinfer.data import accounts

    table = state.resource("dynamodb").Table(state.table)
    current = accounts.get_account(account, table=table).allowed_buckets
    return accounts.configure_account(
        account, allowed_buckets=[*current, bucket], table=table
    ).allowed_buckets
