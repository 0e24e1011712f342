"""The invocation context of the local Lambda runtime."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from batchinfer_local.functions import FunctionSpec
from batchinfer_local.runtime import LocalLambdaContext


def spec(**overrides: Any) -> FunctionSpec:
    values: dict[str, Any] = {
        "logical_id": "Fn",
        "function_name": "stack-Fn",
        "function_arn": "arn:aws:lambda:us-east-1:123456789012:function:stack-Fn",
        "handler_file": Path("/code/app.py"),
        "handler_name": "handler",
        "timeout": 2,
        "memory_size": 256,
    }
    return FunctionSpec(**{**values, **overrides})


def test_context_counts_down_from_the_timeout_or_its_deadline() -> None:
    context = LocalLambdaContext(spec(timeout=2), request_id="r-1")
    assert 1900 < context.get_remaining_time_in_millis() <= 2000
    assert LocalLambdaContext(spec(), deadline=time.monotonic() - 1).get_remaining_time_in_millis() == 0
    assert (context.function_name, context.memory_limit_in_mb, context.aws_request_id) == (
        "stack-Fn",
        256,
        "r-1",
    )
    assert context.invoked_function_arn == "arn:aws:lambda:us-east-1:123456789012:function:stack-Fn"
    assert context.log_group_name == "/aws/lambda/stack-Fn"
