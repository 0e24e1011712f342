"""What a function's execution environments get from the stack: their variables and their concurrency."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .functions import FunctionSpec, SqsEventSpec
from .iam import Credentials
from .template import LOCAL_REGION

# Most environments at once of a function without ReservedConcurrentExecutions (whose real limit is
# the account's unreserved concurrency, 1000 by default), and of an SQS event source without a
# ScalingConfig (Lambda scales those up to 1,250 invocations).
DEFAULT_CONCURRENCY = 10


def concurrency_limit(spec: FunctionSpec, overrides: Mapping[str, int]) -> int:
    """Most environments at once: the override, ReservedConcurrentExecutions, else what its SQS
    sources may run (ScalingConfig.MaximumConcurrency) or `DEFAULT_CONCURRENCY`."""
    if spec.logical_id in overrides:
        return int(overrides[spec.logical_id])
    if spec.reserved_concurrency is not None:
        return spec.reserved_concurrency
    declared = [
        source.maximum_concurrency
        for source in spec.events
        if isinstance(source, SqsEventSpec) and source.maximum_concurrency
    ]
    return max([DEFAULT_CONCURRENCY, *declared])


def function_environ(
    spec: FunctionSpec, overrides: Mapping[str, str], moto_endpoint: str, credentials: Credentials
) -> dict[str, str]:
    """Exactly what the function's environments get: its variables, then Lambda's reserved ones
    (https://docs.aws.amazon.com/lambda/latest/dg/configuration-envvars.html#configuration-envvars-runtime)
    and its role's credentials, which a function cannot override."""
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TZ": ":UTC",
        **spec.environment,
        **overrides,
        "AWS_REGION": LOCAL_REGION,
        "AWS_DEFAULT_REGION": LOCAL_REGION,
        "AWS_LAMBDA_FUNCTION_NAME": spec.function_name,
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_size),
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.function_name}",
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
        "_HANDLER": f"{spec.handler_file.stem}.{spec.handler_name}",
        "LAMBDA_TASK_ROOT": str(spec.handler_file.parent),
        # As `sam local` sets it (Powertools' Tracer then stays off: no X-Ray daemon here).
        "AWS_SAM_LOCAL": "true",
        "AWS_ENDPOINT_URL": moto_endpoint,
        **credentials.environ(),
    }
