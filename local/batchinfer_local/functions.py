"""The template's functions as typed specs, and loading each handler from its source file.

A zip function's handler is `<CodeUri>/<module path>.py`; an image function's is in the
directory of its `Metadata.Dockerfile` (relative to `Metadata.DockerContext`), named by
`ImageConfig.Command[0]`, which is how the Dockerfile lays the code out in the image.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .template import SERVERLESS_FUNCTION, Resolver, TemplateError, merge_function_globals

Handler = Callable[[dict[str, Any], Any], Any]


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class ScalingConfigSpec(_Spec):
    """An SQS event source's `ScalingConfig`: most invocations the mapping runs at once (2..1000)."""

    maximum_concurrency: int = Field(alias="MaximumConcurrency", ge=2, le=1000)


class SqsEventSpec(_Spec):
    """An `SQS` event source (defaults as in the Lambda event source mapping API).

    `maximum_batching_window` is in seconds (0..300); `maximum_concurrency` is None without a ScalingConfig.
    """

    type: Literal["SQS"] = "SQS"
    name: str
    queue_arn: str = Field(alias="Queue")
    batch_size: int = Field(10, alias="BatchSize", ge=1, le=10_000)
    maximum_batching_window: int = Field(0, alias="MaximumBatchingWindowInSeconds", ge=0, le=300)
    scaling_config: ScalingConfigSpec | None = Field(None, alias="ScalingConfig")
    enabled: bool = Field(True, alias="Enabled")
    function_response_types: tuple[str, ...] = Field((), alias="FunctionResponseTypes")

    @property
    def reports_batch_item_failures(self) -> bool:
        """Whether the handler's `batchItemFailures` answer is honoured (else it is ignored)."""
        return "ReportBatchItemFailures" in self.function_response_types

    @property
    def maximum_concurrency(self) -> int | None:
        """ScalingConfig.MaximumConcurrency, if declared."""
        return self.scaling_config.maximum_concurrency if self.scaling_config else None


class ScheduleEventSpec(_Spec):
    """A `Schedule` (EventBridge rule) event source; `input` is the custom event JSON if declared."""

    type: Literal["Schedule"] = "Schedule"
    name: str
    schedule: str = Field(alias="Schedule")
    enabled: bool = Field(True, alias="Enabled")
    input: str | None = Field(None, alias="Input")

    def interval_seconds(self) -> float | None:
        """The period of a `rate(N unit)` expression in seconds; None for `cron(...)`.

        Raises:
            TemplateError: a malformed rate expression.
        """
        if self.schedule.startswith("cron("):
            return None
        match = re.fullmatch(r"rate\((\d+)\s+(minute|minutes|hour|hours|day|days)\)", self.schedule.strip())
        if not match:
            raise TemplateError(f"{self.name}: unsupported schedule expression {self.schedule!r}")
        unit = match.group(2).rstrip("s")
        return int(match.group(1)) * {"minute": 60, "hour": 3600, "day": 86400}[unit]


class DynamoDbEventSpec(_Spec):
    """A `DynamoDB` (stream) event source (defaults as in the Lambda event source mapping API).

    `filter_patterns` are the EventBridge patterns of `FilterCriteria.Filters` (a record invokes when
    it matches any; none: every record); `maximum_batching_window` is in seconds (0..300);
    `maximum_retry_attempts` -1 is unlimited.
    """

    type: Literal["DynamoDB"] = "DynamoDB"
    name: str
    stream_arn: str = Field(alias="Stream")
    starting_position: Literal["TRIM_HORIZON", "LATEST"] = Field(alias="StartingPosition")
    batch_size: int = Field(100, alias="BatchSize", ge=1, le=10_000)
    maximum_batching_window: int = Field(0, alias="MaximumBatchingWindowInSeconds", ge=0, le=300)
    maximum_retry_attempts: int = Field(-1, alias="MaximumRetryAttempts", ge=-1, le=10_000)
    enabled: bool = Field(True, alias="Enabled")
    function_response_types: tuple[str, ...] = Field((), alias="FunctionResponseTypes")
    filter_criteria: dict[str, Any] | None = Field(None, alias="FilterCriteria")

    @property
    def reports_batch_item_failures(self) -> bool:
        """Whether the handler's `batchItemFailures` answer is honoured (else it is ignored)."""
        return "ReportBatchItemFailures" in self.function_response_types

    @property
    def filter_patterns(self) -> list[str]:
        """The filters' patterns (JSON strings)."""
        return [item["Pattern"] for item in (self.filter_criteria or {}).get("Filters") or []]


class HttpApiEventSpec(_Spec):
    """An `HttpApi` event source; no Path/Method means the `$default` route."""

    type: Literal["HttpApi"] = "HttpApi"
    name: str
    method: str = Field("ANY", alias="Method")
    path: str | None = Field(None, alias="Path")
    api_id: str = Field("ServerlessHttpApi", alias="ApiId")

    @property
    def route_key(self) -> str:
        """API Gateway's route key, e.g. `ANY /v1/{proxy+}` or `$default`."""
        return "$default" if self.path is None else f"{self.method.upper()} {self.path}"


EventSpec = Annotated[
    SqsEventSpec | ScheduleEventSpec | DynamoDbEventSpec | HttpApiEventSpec, Field(discriminator="type")
]


class FunctionSpec(_Spec):
    """One function of the template, resolved: what the runtime needs to invoke it.

    `timeout` is in seconds, `memory_size` in MB; `environment` holds the merged, resolved
    variables (Globals + function) as strings; `handler_file`/`handler_name` locate the code;
    `reserved_concurrency` is ReservedConcurrentExecutions (None: the account's unreserved pool);
    `package_type` is `Zip` or `Image`.
    """

    logical_id: str
    function_name: str
    function_arn: str
    handler_file: Path
    handler_name: str
    timeout: int = Field(3, ge=1, le=900)
    memory_size: int = Field(128, ge=128, le=10_240)
    environment: dict[str, str] = {}
    events: tuple[EventSpec, ...] = ()
    reserved_concurrency: int | None = Field(None, ge=0)
    package_type: Literal["Zip", "Image"] = "Zip"


# Event types the runtime can drive; others are reported and skipped.
DRIVEN_EVENT_TYPES = ("SQS", "Schedule", "DynamoDB", "HttpApi")


def handler_location(
    template_dir: Path, logical_id: str, properties: Mapping[str, Any], metadata: Mapping[str, Any]
) -> tuple[Path, str]:
    """The handler's source file (absolute) and function name for a function's merged properties.

    Raises:
        TemplateError: the properties do not say where the code is.
    """
    if properties.get("PackageType") == "Image":
        dockerfile = metadata.get("Dockerfile")
        command = (properties.get("ImageConfig") or {}).get("Command") or []
        if not dockerfile or not command:
            raise TemplateError(
                f"{logical_id}: an image function needs Metadata.Dockerfile and ImageConfig.Command"
            )
        code_dir = (template_dir / metadata.get("DockerContext", ".") / dockerfile).parent
        handler = command[0]
    else:
        code_uri, handler = properties.get("CodeUri"), properties.get("Handler")
        if not isinstance(code_uri, str) or not handler:
            raise TemplateError(f"{logical_id}: a zip function needs a local CodeUri path and a Handler")
        code_dir = template_dir / code_uri
    module, _, name = str(handler).replace("/", ".").rpartition(".")
    if not module or not name:
        raise TemplateError(f"{logical_id}: handler {handler!r} is not <module>.<function>")
    return (code_dir / (module.replace(".", "/") + ".py")).resolve(), name


def function_specs(template: Mapping[str, Any], template_dir: Path, resolver: Resolver) -> list[FunctionSpec]:
    """Every `AWS::Serverless::Function` of `template`, with Globals merged and intrinsics resolved.

    Requires the resources the functions reference to be registered with `resolver` already.

    Raises:
        TemplateError: a function's code location or a property cannot be resolved, or a
            property is out of Lambda's range (timeout 1..900 s, memory 128..10240 MB).
    """
    specs = []
    for logical_id, resource in template["Resources"].items():
        if resource.get("Type") != SERVERLESS_FUNCTION:
            continue
        if "Condition" in resource and not resolver.condition(resource["Condition"]):
            continue
        properties = merge_function_globals(template, logical_id)
        handler_file, handler_name = handler_location(
            template_dir, logical_id, properties, resource.get("Metadata") or {}
        )
        variables = resolver.resolve(
            (properties.get("Environment") or {}).get("Variables") or {}, f"{logical_id}.Environment"
        )
        events = []
        for event_name, event in (properties.get("Events") or {}).items():
            if event.get("Type") not in DRIVEN_EVENT_TYPES:
                raise TemplateError(
                    f"{logical_id}.{event_name}: event type {event.get('Type')} is not emulated locally"
                )
            event_properties = resolver.resolve(
                event.get("Properties") or {}, f"{logical_id}.Events.{event_name}"
            )
            events.append({"type": event["Type"], "name": event_name, **event_properties})
        stack, region, account = (
            resolver.pseudo[k] for k in ("AWS::StackName", "AWS::Region", "AWS::AccountId")
        )
        name = str(resolver.resolve(properties.get("FunctionName", f"{stack}-{logical_id}")))
        try:
            specs.append(
                FunctionSpec(
                    logical_id=logical_id,
                    function_name=name,
                    function_arn=f"arn:aws:lambda:{region}:{account}:function:{name}",
                    handler_file=handler_file,
                    handler_name=handler_name,
                    timeout=int(resolver.resolve(properties.get("Timeout", 3))),
                    memory_size=int(resolver.resolve(properties.get("MemorySize", 128))),
                    environment={key: _env_string(value) for key, value in variables.items()},
                    events=tuple(events),  # validated into the EventSpec union
                    reserved_concurrency=resolver.resolve(properties.get("ReservedConcurrentExecutions")),
                    package_type=properties.get("PackageType", "Zip"),
                )
            )
        except ValidationError as exc:
            raise TemplateError(f"{logical_id}: {exc}") from exc
        resolver.add_resource(logical_id, name, Arn=specs[-1].function_arn)
    return specs


def _env_string(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list):
        raise TemplateError(f"environment values must be scalars, got {value!r}")
    return str(value)


def merged_environment(specs: list[FunctionSpec]) -> dict[str, str]:
    """The functions' variables merged into one environment, for code that calls the domain in-process
    (tests, benchmarks, the local stack's own process); a variable that two functions give different
    values is left out. Each function's own environment is `FunctionSpec.environment`.
    """
    merged: dict[str, str] = {}
    conflicting: set[str] = set()
    for spec in specs:
        for key, value in spec.environment.items():
            if merged.setdefault(key, value) != value:
                conflicting.add(key)
    return {key: value for key, value in merged.items() if key not in conflicting}


def load_handler(spec: FunctionSpec) -> Handler:
    """Import `spec.handler_file` under a module name unique to the function and return its handler.

    The code directory is on `sys.path` while the module executes, as it is the task root in
    Lambda, so top-level imports of sibling modules work (sibling module names are shared by
    all functions of a process: the local stack runs each function in processes of its own).

    Raises:
        TemplateError: the file is missing or does not define a callable handler.
    """
    if not spec.handler_file.is_file():
        raise TemplateError(f"{spec.logical_id}: handler file {spec.handler_file} does not exist")
    module_name = "_batchinfer_local_function_" + re.sub(r"\W", "_", spec.logical_id)
    module_spec = importlib.util.spec_from_file_location(module_name, spec.handler_file)
    if module_spec is None or module_spec.loader is None:
        raise TemplateError(f"{spec.logical_id}: cannot import {spec.handler_file}")
    module = importlib.util.module_from_spec(module_spec)
    code_dir = str(spec.handler_file.parent)
    sys.path.insert(0, code_dir)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    finally:
        sys.path.remove(code_dir)
    handler = getattr(module, spec.handler_name, None)
    if not callable(handler):
        raise TemplateError(f"{spec.logical_id}: {spec.handler_file} has no callable {spec.handler_name}")
    return handler
