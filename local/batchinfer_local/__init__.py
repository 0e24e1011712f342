"""batchinfer's local stack: the pipeline of template.yaml on one machine, no cloud account, no Docker.

moto (in server mode) stands in for DynamoDB, S3, SQS, IAM and STS; each function's handler runs in
execution environments of its own (processes, `environments`), with its own role, driven from its
declared events (SQS event source mappings, schedules, an HTTP API bridge).
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_TEMPLATE", "LocalStack", "TemplateError"]


def __getattr__(name: str) -> Any:
    # Lazy: a function's processes import this package (`zygote`) and need none of the stack.
    if name in ("DEFAULT_TEMPLATE", "LocalStack"):
        from . import stack

        return getattr(stack, name)
    if name == "TemplateError":
        from .template import TemplateError

        return TemplateError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
