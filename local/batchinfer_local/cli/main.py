"""`batchinfer`'s entry point: the argument parser (each command module registers its own commands)
and `main`, which turns every failure into one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import sys

from batchinfer_local.cli import admin, batches, buckets, files, local, redrive, smoke, steering
from batchinfer_local.cli.common import (
    CliError,
    Commands,
    describe_api_error,
    describe_unreachable,
    errors,
    global_options,
)
from batchinfer_local.client import ApiError, Unreachable

# The command modules, in the order `batchinfer --help` lists their commands.
COMMAND_MODULES = (local, batches, files, smoke, admin, buckets, redrive, steering)


def build_parser() -> argparse.ArgumentParser:
    """The `batchinfer` argument parser (every command's options)."""
    from batchinfer_local import cli

    parser = argparse.ArgumentParser(
        prog="batchinfer", description=cli.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    global_options(parser, defaults=True)
    commands = Commands(parser)
    for module in COMMAND_MODULES:
        module.register(commands)
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
