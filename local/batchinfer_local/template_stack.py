"""`TemplateStack`: a SAM template on one machine, with moto standing in for AWS, as strict as AWS.

- IAM: moto authenticates and authorizes every request (`moto_auth` closes the gaps between its
  evaluation and AWS's). Each function runs with credentials of its own role, whose policies are
  exactly what SAM makes of its `Policies` (`iam.sam_roles`). The stack itself, tests and operators
  use the admin identity (`testing`/`testing`, `client()`). `iam=False` (or BATCHINFER_LOCAL_IAM=off)
  turns enforcement off for debugging; the identities stay the same.
- Concurrency: each function runs in execution environments of its own (`environments`), up to its
  ReservedConcurrentExecutions at once (else `lambda_env.DEFAULT_CONCURRENCY`, or its SQS sources'
  declared MaximumConcurrency); SQS event source mappings run up to ScalingConfig.MaximumConcurrency
  batches at once with the declared BatchSize and MaximumBatchingWindowInSeconds; the HTTP API serves
  requests concurrently; schedules invoke asynchronously. Each invocation has its own deadline.
- Start hooks: what an application needs in its resources before its functions start (batchinfer's
  dev API key: `stack.LocalStack`) is passed in by the caller, not known here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from . import iam
from .clients import MotoClients
from .environments import EnvironmentPool, PoolStats
from .functions import (
    DynamoDbEventSpec,
    FunctionSpec,
    HttpApiEventSpec,
    ScheduleEventSpec,
    SqsEventSpec,
    function_specs,
    merged_environment,
)
from .http import HttpApiServer, Route, Router
from .lambda_env import concurrency_limit, function_environ
from .moto_compat import complete_s3_notification, describe_messages, messages_held
from .moto_server import MotoServer, ProcessEnviron
from .pollers import Poller, SchedulePoller, SqsPoller, StreamPoller
from .resources import Resources, create_resources
from .runtime import Activity
from .template import LOCAL_REGION, Resolver, TemplateError, load_template

log = logging.getLogger(__name__)

# "off" (or 0, false, no) turns IAM enforcement off for stacks that do not say (`iam=None`).
IAM_ENV = "BATCHINFER_LOCAL_IAM"

# Used when a schedule is a cron expression and no interval override is given.
CRON_FALLBACK_SECONDS = 60.0

# Variables of the process that starts the stack which reach every function too: the local stack's
# knobs (the model registry, chaos mode, logging the events). Anything else goes through
# `function_environment` or `configure_functions`.
# OpenMP's barrier waits: a setting for the host's load (backends/llama_engine.barrier_wait_environ).
PASSED_THROUGH = (
    "MODEL_REGISTRY",
    "BATCHINFER_CHAOS",
    "POWERTOOLS_LOGGER_LOG_EVENT",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "WEBHOOK_ALLOW_LOOPBACK",  # webhooks to this machine's receivers, only when told (core.netguard)
)

# moto's backends and os.environ are process-wide: one running stack per process.
_active_lock = threading.Lock()
_active: TemplateStack | None = None

# What `start` runs once the resources, roles and the functions' variables exist, before the functions
# start: an application's own set-up (e.g. an item its API needs). An exception fails the start.
StartHook = Callable[["TemplateStack"], None]


def iam_enforced_by_default() -> bool:
    """Whether IAM is enforced when a stack does not say: yes unless $BATCHINFER_LOCAL_IAM is off."""
    return os.environ.get(IAM_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


class TemplateStack:
    """Runs a SAM template locally: moto for DynamoDB/S3/SQS/IAM/STS, each function in its own processes.

    Args:
        template_path: the SAM template.
        port: the HTTP API's port on `host` (0 = a free port).
        redelivery_delay: seconds before a failed SQS message is visible again (whole seconds;
            AWS waits for the queue's VisibilityTimeout, far too long for local use).
        schedule_interval: seconds between Schedule invocations for every schedule (None = the
            template's rate; cron schedules fall back to 60 s).
        parameter_overrides: template parameter values (e.g. {"ShardSize": "10"}).
        host: the interface the HTTP API listens on (loopback by default; moto always listens on
            127.0.0.1 only).
        iam: enforce IAM (None: unless $BATCHINFER_LOCAL_IAM is off).
        function_environment: variables for every function, over the template's and `PASSED_THROUGH`.
        concurrency: most environments at once by function logical id, over the template's.
        start_hooks: called in order with the stack during `start` (see `StartHook`).

    Starting sets process-wide variables for code that calls the domain in this process (tests,
    the CLI): the AWS endpoint, the admin's credentials and the functions' shared variables
    (`environment`); `stop()` restores them. Use as a context manager: `with TemplateStack(path,
    port=0) as stack: ...` starts and stops it.
    """

    def __init__(
        self,
        template_path: str | Path,
        port: int = 8000,
        redelivery_delay: float = 1.0,
        schedule_interval: float | None = None,
        *,
        parameter_overrides: Mapping[str, Any] | None = None,
        host: str = "127.0.0.1",
        iam: bool | None = None,
        function_environment: Mapping[str, str] | None = None,
        concurrency: Mapping[str, int] | None = None,
        start_hooks: Sequence[StartHook] = (),
    ) -> None:
        self.template_path = Path(template_path).resolve()
        self.port = port
        self.redelivery_delay = redelivery_delay
        self.schedule_interval = schedule_interval
        self.parameter_overrides = dict(parameter_overrides or {})
        self.host = host
        self.iam_enforced = iam_enforced_by_default() if iam is None else iam
        self.function_environment = dict(function_environment or {})
        self.concurrency_overrides = dict(concurrency or {})
        self.start_hooks = list(start_hooks)
        self.activity = Activity()
        self._stopping = threading.Event()
        self._environ = ProcessEnviron()
        self._moto = MotoServer(self._environ)
        self._http: HttpApiServer | None = None
        self._sources: list[Poller] = []
        self._clients = MotoClients(lambda: self.moto_endpoint)
        self._resources: Resources | None = None
        self._specs: dict[str, FunctionSpec] = {}
        self._pools: dict[str, EnvironmentPool] = {}
        self._environment: dict[str, str] = {}
        self._consumed_queues: list[str] = []
        self.resolver: Resolver | None = None
        # Each function's role as SAM makes it, resolved (by logical id).
        self.roles: dict[str, iam.RoleSpec] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        """Start moto, create the resources and roles, run the start hooks and start driving the functions.

        Returns the HTTP API base URL, `http://<host>:<port>`.

        Raises:
            TemplateError: the template cannot be run locally (nothing is left running).
            OSError: the HTTP port is taken.
            RuntimeError: another stack is running in this process.
        """
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError(
                    "a LocalStack is already running in this process"
                    " (moto's state and the environment are process-wide)"
                )
            _active = self
        self._pools, self._consumed_queues, self._sources = {}, [], []
        try:
            self._create(load_template(self.template_path))
            for hook in self.start_hooks:
                hook(self)
            self._make_pools(list(self._specs.values()))
            self._start_event_sources()
        except BaseException:
            self.stop()
            raise
        assert self._http is not None
        return self._http.base_url

    def _create(self, template: dict[str, Any]) -> None:
        """moto, the resources, the functions' specs and roles, and their shared variables in this process."""
        self._moto.start(self.iam_enforced, self._clients.of)
        resolver = Resolver(template, self.parameter_overrides)
        self.resolver = resolver
        for logical_id, resource in template["Resources"].items():
            if resource.get("Type") in ("AWS::Serverless::HttpApi", "AWS::Serverless::Api"):
                resolver.add_resource(logical_id, logical_id)  # its Ref is the API id
        self._resources = create_resources(template, resolver, self._service_clients())
        specs = function_specs(template, self.template_path.parent, resolver)
        self._specs = {spec.logical_id: spec for spec in specs}
        for spec in specs:
            if not spec.handler_file.is_file():
                raise TemplateError(f"{spec.logical_id}: handler file {spec.handler_file} does not exist")
        self._create_roles(template, resolver)
        self._environment = merged_environment(specs)
        self._environ.set(self._environment)

    def stop(self) -> None:
        """Stop the event sources, the HTTP server, the functions and moto; restore the environment.

        Invocations still running after a few seconds are ended (their environments killed). Idempotent.
        """
        self._stopping.set()
        started = [source for source in self._sources if source.ident is not None]  # start() may have failed
        polling_ends = time.monotonic() + 5  # one deadline for all: a poller may be in a long poll
        for source in started:
            source.join(timeout=max(0.0, polling_ends - time.monotonic()))
        deadline = time.monotonic() + 10
        for source in started:
            for thread in source.join_batches(max(0.0, deadline - time.monotonic())):
                log.warning("%s is still running an invocation; ending it", thread.name)
        self._sources.clear()
        if self._http is not None:
            self._http.stop()
            self._http = None
        # Each pool waits for its zygote and log forwarders to end: all at once, not one after another.
        with ThreadPoolExecutor(max(1, len(self._pools)), thread_name_prefix="close") as closing:
            list(closing.map(EnvironmentPool.close, self._pools.values()))
        self._moto.stop()
        self._environ.restore()
        self._clients.forget()
        self._stopping = threading.Event()
        global _active
        with _active_lock:
            if _active is self:
                _active = None

    def __enter__(self) -> TemplateStack:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Return once every queue that feeds a function is empty (visible, in flight and delayed), every
        table stream a function reads has been read to its end
        and no invocation is running. Dead-letter queues are not waited on.

        Raises:
            TimeoutError: still busy after `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            generation, looked_at = self.activity.generation, time.monotonic()
            if (
                self.activity.busy == 0
                and self._queues_empty()
                and self._streams_caught_up(looked_at)
                and self.activity.generation == generation
            ):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"local stack still busy after {timeout} s: {self._busy_report()}")
            time.sleep(0.05)

    def _busy_report(self) -> str:
        held = [line for url in self._consumed_queues for line in describe_messages(url, LOCAL_REGION)]
        streams = [source for source in self._sources if isinstance(source, StreamPoller)]
        behind = [source.name for source in streams if time.monotonic() - source.caught_up_at > 5]
        return f"{self.activity.busy} invocations running; messages held: {held}; streams behind: {behind}"

    # ------------------------------------------------------------------ what tests and the CLI see
    @property
    def base_url(self) -> str:
        """The HTTP API base URL (started stack only)."""
        return self._started(self._http).base_url

    @property
    def moto_endpoint(self) -> str:
        """moto's endpoint, `http://127.0.0.1:<port>` (also in AWS_ENDPOINT_URL while started)."""
        return self._started(self._moto.endpoint)

    @property
    def region(self) -> str:
        """The AWS region of the local stack."""
        return LOCAL_REGION

    @property
    def tables(self) -> dict[str, str]:
        """DynamoDB table names by logical id."""
        return dict(self._started(self._resources).tables)

    @property
    def buckets(self) -> dict[str, str]:
        """S3 bucket names by logical id."""
        return dict(self._started(self._resources).buckets)

    @property
    def queue_urls(self) -> dict[str, str]:
        """SQS queue URLs by logical id (dead-letter queues included)."""
        return dict(self._started(self._resources).queue_urls)

    @property
    def queue_arns(self) -> dict[str, str]:
        """SQS queue ARNs by logical id (dead-letter queues included)."""
        return dict(self._started(self._resources).queue_arns)

    @property
    def functions(self) -> dict[str, FunctionSpec]:
        """The resolved function specs by logical id."""
        return dict(self._specs)

    @property
    def environment(self) -> dict[str, str]:
        """The functions' shared variables (`merged_environment`), as set in this process
        (e.g. TABLE_NAME)."""
        return dict(self._environment)

    def function_environment_of(self, logical_id: str) -> dict[str, str]:
        """The variables of the function `logical_id`'s environments (its role's credentials included)."""
        return self._pools[logical_id].environ

    def invocations(self, logical_id: str) -> int:
        """How many times the function `logical_id` has been invoked since start."""
        return self._pools[logical_id].invocations

    def pool_stats(self, logical_id: str) -> PoolStats:
        """The function's invocations, their high-water mark (most at once), cold starts and limit."""
        return self._pools[logical_id].pool_stats()

    def stats(self, logical_id: str | None = None) -> Counter[str]:
        """Counters from inside the functions (one or all), summed since start or `reset_stats`:
        `aws:<service>.<Operation>` calls made through `batchinfer.core.aws`, `chaos:<fault>` faults
        injected (`duplicate_delivery` by the event source mappings)."""
        pools = [self._pools[logical_id]] if logical_id else list(self._pools.values())
        return sum((pool.stats() for pool in pools), Counter())

    def reset_stats(self) -> None:
        """Start every function's `stats` from nothing again."""
        for pool in self._pools.values():
            pool.reset_stats()

    def configure_functions(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        unset: Iterable[str] = (),
        call: Iterable[str] = (),
        functions: Iterable[str] | None = None,
    ) -> None:
        """Change the variables of every function (or of `functions`, logical ids) in all their
        environments, before each one's next invocation; then call each dotted name of `call` there,
        e.g. `batchinfer.core.settings.get_settings.cache_clear` (skipped where its module is not loaded)."""
        environ, unset, call = dict(environ or {}), list(unset), list(call)
        for logical_id in self._pools if functions is None else list(functions):
            self._pools[logical_id].configure(environ, unset, call)

    def client(self, service: str) -> Any:
        """A boto3 client for `service` pointed at moto, as the stack's admin (cached; thread-safe)."""
        return self._clients.admin(service)

    def function_client(self, logical_id: str, service: str) -> Any:
        """A boto3 client for `service` pointed at moto with the role credentials of function `logical_id`."""
        return self._clients.function(logical_id, service)

    @property
    def sqs(self) -> Any:
        """SQS client (see `client`)."""
        return self.client("sqs")

    @property
    def s3(self) -> Any:
        """S3 client (see `client`)."""
        return self.client("s3")

    @property
    def dynamodb(self) -> Any:
        """DynamoDB client (see `client`)."""
        return self.client("dynamodb")

    # ------------------------------------------------------------------ internals
    def _started(self, value: Any) -> Any:
        if value is None:
            raise RuntimeError("LocalStack is not started")
        return value

    def _create_roles(self, template: dict[str, Any], resolver: Resolver) -> None:
        """Each function's role as SAM makes it, created in moto and assumed (`self._clients.credentials`)."""
        roles = iam.sam_roles(template, resolver.parameters)
        stack_name = resolver.pseudo["AWS::StackName"]
        for logical_id, spec in self._specs.items():
            role = roles[logical_id].resolve(resolver)
            self.roles[logical_id] = role
            self._clients.credentials[logical_id] = iam.create_role(
                role, stack_name, spec.function_name, self.client
            )

    def _service_clients(self) -> dict[str, Any]:
        return {name: self.client(name) for name in ("sqs", "dynamodb", "s3")}

    def _make_pools(self, specs: list[FunctionSpec]) -> None:
        overrides = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
        for spec in specs:
            environ = function_environ(
                spec,
                {**overrides, **self.function_environment},
                self.moto_endpoint,
                self._clients.credentials[spec.logical_id],
            )
            # The image functions run the embedded model: llama.cpp sizes its threads by the CPUs it may
            # use, so concurrent environments share this machine's cores (see EnvironmentPool).
            self._pools[spec.logical_id] = EnvironmentPool(
                spec,
                environ,
                self.activity,
                limit=concurrency_limit(spec, self.concurrency_overrides),
                share_cpus=spec.package_type == "Image",
            )
        # Every function's init at once (processes of their own), as the old in-process stack imported
        # every handler in start(): the first request then finds its function ready.
        warming = [
            threading.Thread(target=pool.warm, name=f"init-{name}") for name, pool in self._pools.items()
        ]
        for thread in warming:
            thread.start()
        for thread in warming:
            thread.join()

    def _start_event_sources(self) -> None:
        """A poller per enabled SQS, Schedule and DynamoDB source; the HTTP API for the HttpApi ones."""
        assert self.resolver is not None
        routes = []
        for pool in self._pools.values():
            for source in pool.spec.events:
                if isinstance(source, HttpApiEventSpec):
                    routes.append(Route.of(pool, source))
                elif source.enabled:
                    self._sources.append(self._poller(pool, source))
        self._http = HttpApiServer(
            Router(routes), self.resolver.pseudo["AWS::AccountId"], self.host, self.port
        )
        self._http.start()
        for source in self._sources:
            source.start()

    def _poller(
        self, pool: EnvironmentPool, source: SqsEventSpec | ScheduleEventSpec | DynamoDbEventSpec
    ) -> Poller:
        logical_id = pool.spec.logical_id
        if isinstance(source, SqsEventSpec):
            resources = self._started(self._resources)
            queue = resources.queue_by_arn(source.queue_arn)
            self._consumed_queues.append(resources.queue_urls[queue])
            transform = complete_s3_notification if queue in resources.notification_queues else None
            sqs, admin_sqs = self.function_client(logical_id, "sqs"), self.client("sqs")
            url = resources.queue_urls[queue]
            return SqsPoller(
                pool,
                source,
                url,
                sqs,
                admin_sqs,
                LOCAL_REGION,
                self.redelivery_delay,
                self._stopping,
                transform,
            )
        if isinstance(source, ScheduleEventSpec):
            assert self.resolver is not None
            pseudo = self.resolver.pseudo
            interval = self._schedule_interval(logical_id, source)
            stack_name, account = pseudo["AWS::StackName"], pseudo["AWS::AccountId"]
            return SchedulePoller(pool, source, interval, stack_name, account, LOCAL_REGION, self._stopping)
        streams = self.function_client(logical_id, "dynamodbstreams")
        return StreamPoller(pool, source, streams, LOCAL_REGION, self.redelivery_delay, self._stopping)

    def _schedule_interval(self, logical_id: str, source: ScheduleEventSpec) -> float:
        interval = self.schedule_interval or source.interval_seconds()
        if interval is None:
            log.warning(
                "%s.%s: cron schedule runs every %.0f s locally",
                logical_id,
                source.name,
                CRON_FALLBACK_SECONDS,
            )
            interval = CRON_FALLBACK_SECONDS
        return interval

    def _streams_caught_up(self, since: float) -> bool:
        # Each stream source has polled, after `since`, and found nothing left to deliver.
        streams = [source for source in self._sources if isinstance(source, StreamPoller)]
        while any(source.caught_up_at <= since for source in streams):
            if self._stopping.is_set() or time.monotonic() - since > 5:
                return False
            time.sleep(0.05)
        return True

    def _queues_empty(self) -> bool:
        return not any(messages_held(url, LOCAL_REGION) for url in self._consumed_queues)
