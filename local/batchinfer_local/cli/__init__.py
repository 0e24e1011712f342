"""`batchinfer`: run the local stack, submit batches, follow them and fetch their results.

    batchinfer local [--port 8000] [--no-iam]     the whole pipeline on this machine, in the foreground
    batchinfer submit FILE [--wait] [-o DIR]      upload a JSONL file and create a batch
        [--endpoint E] [--completion-window 24h] [--metadata K=V ...] [--output-expires-after SECONDS]
        [--dry-run]                               check the file, estimate its tokens and cost; no batch
    batchinfer status BATCH_ID [--watch]          the batch in short: id, status, endpoint, counts, times
                                                  (--json: the Batch object; --watch: as `wait`)
    batchinfer wait BATCH_ID                      a progress bar until the batch ends (not completed: one
                                                  line on stderr, how and why, and exit 1)
    batchinfer list [--limit N]                   your batches, newest first
    batchinfer cancel BATCH_ID                    cancel a batch
    batchinfer download BATCH_ID [-o DIR]         output.jsonl and error.jsonl (--merged: merged.jsonl, the
        [--merged | --partial]                    latest line of each custom_id across it and its retries;
                                                  --partial: the output done so far, while it runs)
    batchinfer retry BATCH_ID                     a new batch of an ended batch's failed and unrun lines
    batchinfer files list|delete [FILE_ID]        your files
    batchinfer smoke [--second-api-key KEY]       the whole user flow against a stack, one line per step
    batchinfer demo FILE                          local stack + submit --wait + print answers, then stop
    batchinfer keys create|revoke|list ...        API keys (only their hash is stored)
    batchinfer accounts show|set ID ...           bucket allowlist, limit overrides, webhook URL
    batchinfer buckets create NAME --local [--account ACCOUNT]
                                                  a TokenHub user bucket on the local stack: created in its
                                                  S3 and added to the account's allowlist (default: the
                                                  dev key's account); NAME must match UserBucketPattern
    batchinfer redrive DLQ_URL --to QUEUE_URL     move a dead-letter queue's messages back to their queue

The client commands talk to `--base-url` (default `$BATCHINFER_BASE_URL`, else the local stack at
http://127.0.0.1:8000/v1) with `--api-key` (default `$BATCHINFER_API_KEY`); `--json` prints the API's
JSON instead of text. These options go before or after the command. The local stack's key is
`$BATCHINFER_DEV_API_KEY`, or one it generates and prints.

`keys` and `accounts` write the batch table directly with your AWS credentials: name it with
`--table` (default `$BATCHINFER_TABLE`) or `--stack-name` (its `TableName` output); `--local` uses the
running local stack's moto, table and admin identity instead (from the state file `batchinfer local`
writes), as `buckets create` does.

Every failure is one line on stderr (the server's message, the HTTP status, what to do) and a
non-zero exit code: 1 for a failed request or batch, 2 for a usage error.
"""

from __future__ import annotations

from batchinfer_local.cli.common import CliError, describe_api_error
from batchinfer_local.cli.main import build_parser, main
from batchinfer_local.cli.state import STATE_ENV, state_path, write_state

# One module per command group (`local`, `batches`, `files`, `smoke`, `admin`, `buckets`, `redrive`,
# `steering`),
# each registering its own subcommands; `main` is the console script `batchinfer`.
__all__ = ["STATE_ENV", "CliError", "build_parser", "describe_api_error", "main", "state_path", "write_state"]
