"""`batchinfer smoke`: the whole user flow against a stack, one line per step."""

from __future__ import annotations

import argparse
import json

from batchinfer_local.cli.common import Commands, console
from batchinfer_local.smoke import Outcome, StepResult, run_smoke

# The colour of each step outcome's word.
_COLOURS = {Outcome.PASS: "green", Outcome.FAIL: "red", Outcome.SKIP: "yellow"}


def register(commands: Commands) -> None:
    """Add `smoke`."""
    smoke = commands.add("smoke", cmd_smoke, "run the whole user flow against a stack, one line per step")
    smoke.add_argument("--second-api-key", help="a key of another account: probes that it sees nothing")
    smoke.add_argument("--model", help="the model of the test batch (default: the first of GET /v1/models)")
    smoke.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each batch")


def cmd_smoke(args: argparse.Namespace) -> int:
    """Run every step, printing each result as it comes; exit 1 if any failed."""

    def report(result: StepResult) -> None:
        if args.json:
            print(json.dumps(result.model_dump(mode="json")), flush=True)
        else:
            console.print(
                f"[{_COLOURS[result.outcome]}]{result.outcome}[/] {result.step:<14} {result.detail}"
            )

    results = run_smoke(
        args.base_url,
        args.api_key,
        second_api_key=args.second_api_key,
        model=args.model,
        timeout_s=args.timeout,
        report=report,
    )
    return 1 if any(r.outcome == Outcome.FAIL for r in results) else 0
