"""`LocalStack`: the whole template on one machine, with moto standing in for AWS, as strict as AWS.

- IAM: moto authenticates and authorizes every request (`moto_auth` closes the gaps between its
  evaluation and AWS's). Each function runs with credentials of its own role, whose policies are
  exactly what SAM makes of its `Policies` (`iam.sam_roles`). The stack itself, tests and operators
  use the admin identity (`testing`/`testing`, `client()`). `iam=False` (or BATCHINFER_LOCAL_IAM=off)
  turns enforcement off for debugging; the identities stay the same.
- Concurrency: each function runs in execution environments of its own (`environments`), up to its
  ReservedConcurrentExecutions at once (else `DEFAULT_CONCURRENCY`, or its SQS sources' declared
  MaximumConcurrency); SQS event source mappings run up to ScalingConfig.MaximumConcurrency batches at
  once with the declared BatchSize and MaximumBatchingWindowInSeconds; the HTTP API serves requests
  concurrently; schedules invoke asynchronously. Each invocation has its own deadline.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3
from botocore.config import Config
from moto.server import ThreadedMotoServer

from . import iam, moto_auth
from .environments import EnvironmentPool, PoolStats
from .functions import (
    DynamoDbEventSpec,
    FunctionSpec,
    ScheduleEventSpec,
    SqsEventSpec,
    function_specs,
    merged_environment,
)
from .http import HttpApiServer, Route, Router
from .moto_atomic import serialize_item_operations
from .moto_compat import (
    complete_s3_notification,
    deliver_fairly,
    messages_held,
    query_one_partition,
    trim_read_stream_records,
)
from .resources import Resources, create_resources
from .runtime import Activity, DynamoDbStreamSource, ScheduleRunner, SqsEventSource
from .template import LOCAL_REGION, Resolver, TemplateError, load_template

log = logging.getLogger(__name__)

# The repository's template.yaml (this package lives in <repo>/local/batchinfer_local).
DEFAULT_TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"

# The local dev API key: this variable's value, else a generated key (printed by `batchinfer local`).
# It belongs to the account that also owns inbox uploads (Settings.inbox_account_id's default).
DEV_API_KEY_ENV = "BATCHINFER_DEV_API_KEY"
DEV_ACCOUNT = "default"

# "off" (or 0, false, no) turns IAM enforcement off for stacks that do not say (`LocalStack(iam=None)`).
IAM_ENV = "BATCHINFER_LOCAL_IAM"

# Used when a schedule is a cron expression and no interval override is given.
CRON_FALLBACK_SECONDS = 60.0

# Most environments at once of a function without ReservedConcurrentExecutions (whose real limit is
# the account's unreserved concurrency, 1000 by default), and of an SQS event source without a
# ScalingConfig (Lambda scales those up to 1,250 invocations).
DEFAULT_CONCURRENCY = 10

# Variables of the process that starts the stack which reach every function too: the local stack's
# knobs (README: the model registry, chaos mode, logging the events). Anything else goes through
# `function_environment` or `configure_functions`.
# OpenMP's barrier waits: a setting for the host's load (backends/llama_engine.barrier_wait_environ).
PASSED_THROUGH = (
    "MODEL_REGISTRY",
    "BATCHINFER_CHAOS",
    "POWERTOOLS_LOGGER_LOG_EVENT",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
)

# Variables that would send boto3 elsewhere than moto if left in the environment.
_AWS_OVERRIDES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=64)


# moto's backends and os.environ are process-wide: one running stack per process.
_active_lock = threading.Lock()
_active: LocalStack | None = None


def iam_enforced_by_default() -> bool:
    """Whether IAM is enforced when a stack does not say: yes unless $BATCHINFER_LOCAL_IAM is off."""
    return os.environ.get(IAM_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


class LocalStack:
    """Runs template.yaml locally: moto for DynamoDB/S3/SQS/IAM/STS, each function in its own processes.

    Args:
        template_path: the SAM template (default: the repository's template.yaml).
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

    Starting sets process-wide variables for code that calls the domain in this process (tests,
    the CLI): the AWS endpoint, the admin's credentials and the functions' shared variables
    (`environment`); `stop()` restores them. Use as a context manager: `with LocalStack(port=0) as
    stack: ...` starts and stops it. The HTTP API needs a key: `stack.api_key` (account
    `DEV_ACCOUNT`) is `$BATCHINFER_DEV_API_KEY`, or a fresh key when that is unset
    (`stack.api_key_generated`).
    """

    def __init__(
        self,
        template_path: str | Path = DEFAULT_TEMPLATE,
        port: int = 8000,
        redelivery_delay: float = 1.0,
        schedule_interval: float | None = None,
        *,
        parameter_overrides: Mapping[str, Any] | None = None,
        host: str = "127.0.0.1",
        iam: bool | None = None,
        function_environment: Mapping[str, str] | None = None,
        concurrency: Mapping[str, int] | None = None,
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
        self.activity = Activity()
        self._stopping = threading.Event()
        self._moto: ThreadedMotoServer | None = None
        self._endpoint: str | None = None
        self._auth_saved: tuple[float, int] | None = None
        self._http: HttpApiServer | None = None
        self._sources: list[SqsEventSource | ScheduleRunner | DynamoDbStreamSource] = []
        self._saved_environ: dict[str, str | None] = {}
        self._clients: dict[str, Any] = {}
        self._function_clients: dict[tuple[str, str], Any] = {}
        self._clients_lock = threading.Lock()
        self._session: boto3.session.Session | None = None
        self._credentials: dict[str, iam.Credentials] = {}
        self._resources: Resources | None = None
        self._specs: dict[str, FunctionSpec] = {}
        self._pools: dict[str, EnvironmentPool] = {}
        self._environment: dict[str, str] = {}
        self._consumed_queues: list[str] = []
        self.resolver: Resolver | None = None
        # Each function's role as SAM makes it, resolved (by logical id).
        self.roles: dict[str, iam.RoleSpec] = {}
        # The local dev API key (see `_provision_dev_key`); None until started, or for other templates.
        self.api_key: str | None = None
        self.api_key_generated = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        """Start moto, create the resources and roles, and start driving the functions.

        Returns the HTTP API base URL, `http://<host>:<port>`.

        Raises:
            TemplateError: the template cannot be run locally (nothing is left running).
            OSError: the HTTP port is taken.
            RuntimeError: another LocalStack is running in this process.
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
            template = load_template(self.template_path)
            self._start_moto()
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
            self._set_environ(self._environment)
            _forget_cached_settings()
            self.api_key = self._provision_dev_key()
            self._make_pools(specs)
            self._start_event_sources()
        except BaseException:
            self.stop()
            raise
        assert self._http is not None
        return self._http.base_url

    def stop(self) -> None:
        """Stop the event sources, the HTTP server, the functions and moto; restore the environment.

        Invocations still running after a few seconds are ended (their environments killed). Idempotent.
        """
        self._stopping.set()
        started = [source for source in self._sources if source.ident is not None]  # start() may have failed
        for source in started:
            source.join(timeout=5)
        deadline = time.monotonic() + 10
        for source in started:
            for thread in source.join_batches(max(0.0, deadline - time.monotonic())):
                log.warning("%s is still running an invocation; ending it", thread.name)
        self._sources.clear()
        if self._http is not None:
            self._http.stop()
            self._http = None
        for pool in self._pools.values():
            pool.close()
        if self._moto is not None:
            self._moto.stop()
            self._moto = None
        self._restore_auth()
        self._endpoint = None
        for key, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_environ.clear()
        self._clients.clear()
        self._function_clients.clear()
        _forget_cached_settings()
        self._stopping = threading.Event()
        global _active
        with _active_lock:
            if _active is self:
                _active = None

    def __enter__(self) -> LocalStack:
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
                raise TimeoutError(f"local stack still busy after {timeout} s")
            time.sleep(0.05)

    # ------------------------------------------------------------------ what tests and the CLI see
    @property
    def base_url(self) -> str:
        """The HTTP API base URL (started stack only)."""
        return self._started(self._http).base_url

    @property
    def moto_endpoint(self) -> str:
        """moto's endpoint, `http://127.0.0.1:<port>` (also in AWS_ENDPOINT_URL while started)."""
        return self._started(self._endpoint)

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
        with self._clients_lock:
            if service not in self._clients:
                self._clients[service] = self._make_client(iam.ADMIN, service)
            return self._clients[service]

    def function_client(self, logical_id: str, service: str) -> Any:
        """A boto3 client for `service` pointed at moto with the role credentials of function `logical_id`."""
        with self._clients_lock:
            key = (logical_id, service)
            if key not in self._function_clients:
                self._function_clients[key] = self._make_client(self._credentials[logical_id], service)
            return self._function_clients[key]

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

    def _start_moto(self) -> None:
        from moto import settings
        from moto.core.authorization import ActionAuthenticatorMixin

        # moto's werkzeug server logs every request at INFO.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        serialize_item_operations()  # moto's DynamoDB is not atomic across request threads
        trim_read_stream_records()
        deliver_fairly()
        query_one_partition()
        self._auth_saved = (settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count)
        moto_auth.install()
        # The AWS managed policies SAM attaches (AWSLambdaBasicExecutionRole, ...), loaded by moto.
        self._set_environ({"MOTO_IAM_LOAD_MANAGED_POLICIES": "true"})
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self._endpoint = f"http://{host}:{port}"
        aws = {
            "AWS_ENDPOINT_URL": self._endpoint,
            "AWS_ACCESS_KEY_ID": iam.ADMIN.access_key_id,
            "AWS_SECRET_ACCESS_KEY": iam.ADMIN.secret_access_key,
            "AWS_DEFAULT_REGION": LOCAL_REGION,
            "AWS_REGION": LOCAL_REGION,
        }
        service_endpoints = [key for key in os.environ if key.startswith("AWS_ENDPOINT_URL_")]
        self._set_environ(aws, remove=[*_AWS_OVERRIDES, *service_endpoints])
        # moto's state is process-global: start from nothing, whatever ran before in this process.
        request = urllib.request.Request(f"{self._endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass
        iam.bootstrap_admin(self._endpoint, self._credential_client)
        iam.set_enforcement(self._endpoint, self.iam_enforced)

    def _restore_auth(self) -> None:
        # Enforcement is process-wide in moto: leave it as it was (e.g. for in-process mock_aws tests).
        if self._auth_saved is not None:
            from moto import settings
            from moto.core.authorization import ActionAuthenticatorMixin

            settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count = self._auth_saved
            self._auth_saved = None
            moto_auth.uninstall()
            trim_read_stream_records(False)  # moto's own streams again for in-process mock_aws tests
            deliver_fairly(False)
            query_one_partition(False)

    def _make_client(self, credentials: iam.Credentials, service: str) -> Any:
        # One session for every client: it loads each service model once.
        if self._session is None:
            self._session = boto3.session.Session(region_name=LOCAL_REGION)
        return credentials.client(
            self._session, service, endpoint_url=self.moto_endpoint, config=_CLIENT_CONFIG
        )

    def _credential_client(self, credentials: iam.Credentials, service: str) -> Any:
        with self._clients_lock:
            return self._make_client(credentials, service)

    def _create_roles(self, template: dict[str, Any], resolver: Resolver) -> None:
        """Each function's role as SAM makes it, created in moto and assumed (`self._credentials`)."""
        roles = iam.sam_roles(template, resolver.parameters)
        stack_name = resolver.pseudo["AWS::StackName"]
        for logical_id, spec in self._specs.items():
            role = roles[logical_id].resolve(resolver)
            self.roles[logical_id] = role
            self._credentials[logical_id] = iam.create_role(role, stack_name, spec.function_name, self.client)

    def _provision_dev_key(self) -> str | None:
        """Store the local dev API key for account `DEV_ACCOUNT`: `$BATCHINFER_DEV_API_KEY`, else a new one.

        Only for templates whose functions get a `TABLE_NAME` (batchinfer's); None otherwise.
        """
        table_name = self._environment.get("TABLE_NAME")
        if not table_name:
            return None
        from batchinfer.data import accounts

        self.api_key_generated = not os.environ.get(DEV_API_KEY_ENV)
        secret = os.environ.get(DEV_API_KEY_ENV) or accounts.new_secret()
        table = (
            boto3.session.Session()
            .resource(
                "dynamodb",
                endpoint_url=self.moto_endpoint,
                region_name=LOCAL_REGION,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
            .Table(table_name)
        )
        accounts.create_key(DEV_ACCOUNT, name="local dev key", secret=secret, table=table)
        # The key itself is never logged: `batchinfer local` shows it on the console, tests read `api_key`.
        log.info(
            "local dev API key for account %r stored (%s)",
            DEV_ACCOUNT,
            f"from ${DEV_API_KEY_ENV}" if not self.api_key_generated else "generated",
        )
        return secret

    def _set_environ(self, values: Mapping[str, str], remove: list[str] | tuple[str, ...] = ()) -> None:
        for key in [*values, *remove]:
            self._saved_environ.setdefault(key, os.environ.get(key))
        for key in remove:
            os.environ.pop(key, None)
        os.environ.update(values)

    def _service_clients(self) -> dict[str, Any]:
        return {name: self.client(name) for name in ("sqs", "dynamodb", "s3")}

    def _make_pools(self, specs: list[FunctionSpec]) -> None:
        overrides = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
        for spec in specs:
            environ = self._function_environ(spec, {**overrides, **self.function_environment})
            # The image functions run the embedded model: llama.cpp sizes its threads by the CPUs it may
            # use, so concurrent environments share this machine's cores (see EnvironmentPool).
            self._pools[spec.logical_id] = EnvironmentPool(
                spec, environ, self.activity, limit=self._limit(spec), share_cpus=spec.package_type == "Image"
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

    def _limit(self, spec: FunctionSpec) -> int:
        """Most environments at once: the override, ReservedConcurrentExecutions, else what its SQS
        sources may run (ScalingConfig.MaximumConcurrency) or `DEFAULT_CONCURRENCY`."""
        if spec.logical_id in self.concurrency_overrides:
            return int(self.concurrency_overrides[spec.logical_id])
        if spec.reserved_concurrency is not None:
            return spec.reserved_concurrency
        declared = [
            source.maximum_concurrency
            for source in spec.events
            if isinstance(source, SqsEventSpec) and source.maximum_concurrency
        ]
        return max([DEFAULT_CONCURRENCY, *declared])

    def _function_environ(self, spec: FunctionSpec, overrides: Mapping[str, str]) -> dict[str, str]:
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
            "AWS_ENDPOINT_URL": self.moto_endpoint,
            **self._credentials[spec.logical_id].environ(),
        }

    def _start_event_sources(self) -> None:
        resources = self._started(self._resources)
        assert self.resolver is not None
        pseudo = self.resolver.pseudo
        routes = []
        for logical_id, pool in self._pools.items():
            for source in pool.spec.events:
                if isinstance(source, SqsEventSpec):
                    if not source.enabled:
                        continue
                    queue = resources.queue_by_arn(source.queue_arn)
                    self._consumed_queues.append(resources.queue_urls[queue])
                    self._sources.append(
                        SqsEventSource(
                            pool,
                            source,
                            resources.queue_urls[queue],
                            self.function_client(logical_id, "sqs"),
                            self.client("sqs"),
                            LOCAL_REGION,
                            self.redelivery_delay,
                            self._stopping,
                            complete_s3_notification if queue in resources.notification_queues else None,
                        )
                    )
                elif isinstance(source, ScheduleEventSpec):
                    if not source.enabled:
                        continue
                    interval = self.schedule_interval or source.interval_seconds()
                    if interval is None:
                        log.warning(
                            "%s.%s: cron schedule runs every %.0f s locally",
                            logical_id,
                            source.name,
                            CRON_FALLBACK_SECONDS,
                        )
                        interval = CRON_FALLBACK_SECONDS
                    self._sources.append(
                        ScheduleRunner(
                            pool,
                            source,
                            interval,
                            pseudo["AWS::StackName"],
                            pseudo["AWS::AccountId"],
                            LOCAL_REGION,
                            self._stopping,
                        )
                    )
                elif isinstance(source, DynamoDbEventSpec):
                    if not source.enabled:
                        continue
                    self._sources.append(
                        DynamoDbStreamSource(
                            pool,
                            source,
                            self.function_client(logical_id, "dynamodbstreams"),
                            LOCAL_REGION,
                            self.redelivery_delay,
                            self._stopping,
                        )
                    )
                else:
                    routes.append(Route.of(pool, source))
        self._http = HttpApiServer(Router(routes), pseudo["AWS::AccountId"], self.host, self.port)
        self._http.start()
        for source in self._sources:
            source.start()

    def _streams_caught_up(self, since: float) -> bool:
        # Each stream source has polled, after `since`, and found nothing left to deliver.
        streams = [source for source in self._sources if isinstance(source, DynamoDbStreamSource)]
        while any(source.caught_up_at <= since for source in streams):
            if self._stopping.is_set() or time.monotonic() - since > 5:
                return False
            time.sleep(0.05)
        return True

    def _queues_empty(self) -> bool:
        return not any(messages_held(url, LOCAL_REGION) for url in self._consumed_queues)


def _forget_cached_settings() -> None:
    """Drop batchinfer's cached Settings so code in this process sees this stack's environment,
    not a previous one."""
    settings = sys.modules.get("batchinfer.core.settings")
    if settings is not None and hasattr(settings, "get_settings"):
        settings.get_settings.cache_clear()


__all__ = ["DEFAULT_TEMPLATE", "DEV_ACCOUNT", "DEV_API_KEY_ENV", "IAM_ENV", "LocalStack", "TemplateError"]
