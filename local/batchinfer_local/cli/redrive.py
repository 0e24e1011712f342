"""`batchinfer redrive`: move a dead-letter queue's messages back to their queue."""

from __future__ import annotations

import argparse
import os

from batchinfer_local.cli.common import Commands, console


def register(commands: Commands) -> None:
    """Add `redrive`."""
    redrive = commands.add("redrive", cmd_redrive, "move a dead-letter queue's messages back to their queue")
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


def cmd_redrive(args: argparse.Namespace) -> int:
    """Move the messages with your AWS credentials; how many moved."""
    import boto3

    from batchinfer_local.redrive import redrive

    moved = redrive(
        boto3.client("sqs", endpoint_url=args.endpoint_url), args.dlq_url, args.target_url, limit=args.limit
    )
    console.print(f"moved {moved} message(s) to {args.target_url}")
    return 0
