"""`LocalStack`: the whole template on one machine, with moto standing in for AWS."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from .functions import FunctionSpec, ScheduleEventSpec, SqsEventSpec, function_specs, load_handler, merged_environment
from .http import HttpApiServer, Route, Router
from .moto_atomic import serialize_item_operations
from .moto_compat import complete_s3_notification
from .resources import Resources, create_resources
from .runtime import Activity, FunctionRuntime, ScheduleRunner, SqsPoller
from .template import LOCAL_REGION, Resolver, TemplateError, load_template

log = logging.getLogger(__name__)

# The repository's template.yaml (this package lives in <repo>/local/batchinfer_local).
DEFAULT_TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"

# The local dev API key: this variable's value, else a generated key (printed by `batchinfer local`).
# It belongs to the account that also owns inbox uploads (Settings.inbox_account_id's default).
DEV_API_KEY_ENV = "BATCHINFER_DEV_API_KEY"
DEV_ACCOUNT = "default"

# Used when a schedule is a cron expression and no interval override is given.
CRON_FALLBACK_SECONDS = 60.0

# Variables that would send boto3 elsewhere than moto if left in the environment.
_AWS_OVERRIDES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


# moto's backends and os.environ are process-wide: one running stack per process.
_active_lock = threading.Lock()
_active: LocalStack | None = None


class LocalStack:
    """Runs template.yaml locally: moto for DynamoDB/S3/SQS, handlers invoked in-process.

    Args:
        template_path: the SAM template (default: the repository's template.yaml).
        port: the HTTP API's port on 127.0.0.1 (0 = a free port).
        redelivery_delay: seconds before a failed SQS message is visible again (whole seconds;
            AWS waits for the queue's VisibilityTimeout, far too long for local use).
        schedule_interval: seconds between Schedule invocations for every schedule (None = the
            template's rate; cron schedules fall back to 60 s).
        parameter_overrides: template parameter values (e.g. {"ShardSize": "10"}).
        host: the interface the HTTP API and moto listen on (loopback by default).

    All functions share this process, so starting sets process-wide environment variables
    (the AWS endpoint and credentials, and the functions' variables); `stop()` restores them.
    Use as a context manager: `with LocalStack(port=0) as stack: ...` starts and stops it.
    The HTTP API needs a key: `stack.api_key` (account `DEV_ACCOUNT`) is `$BATCHINFER_DEV_API_KEY`,
    or a fresh key when that is unset (`stack.api_key_generated`).
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
    ) -> None:
        self.template_path = Path(template_path).resolve()
        self.port = port
        self.redelivery_delay = redelivery_delay
        self.schedule_interval = schedule_interval
        self.parameter_overrides = dict(parameter_overrides or {})
        self.host = host
        self.activity = Activity()
        self._stopping = threading.Event()
        self._moto: ThreadedMotoServer | None = None
        self._endpoint: str | None = None
        self._http: HttpApiServer | None = None
        self._threads: list[threading.Thread] = []
        self._saved_environ: dict[str, str | None] = {}
        self._modules: list[str] = []
        self._clients: dict[str, Any] = {}
        self._resources: Resources | None = None
        self._specs: dict[str, FunctionSpec] = {}
        self._runtimes: dict[str, FunctionRuntime] = {}
        self._environment: dict[str, str] = {}
        self._consumed_queues: list[str] = []
        self.resolver: Resolver | None = None
        # The local dev API key (see `_provision_dev_key`); None until started, or for other templates.
        self.api_key: str | None = None
        self.api_key_generated = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        """Start moto, create the resources, load the handlers and start driving them.

        Returns the HTTP API base URL, `http://127.0.0.1:<port>`.

        Raises:
            TemplateError: the template cannot be run locally (nothing is left running).
            OSError: the HTTP port is taken.
            RuntimeError: another LocalStack is running in this process.
        """
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError(
                    "a LocalStack is already running in this process (moto's state and the environment are process-wide)"
                )
            _active = self
        self._runtimes, self._consumed_queues = {}, []
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
            self._environment = merged_environment(specs)
            self._set_environ(self._environment)
            _forget_cached_settings()
            self.api_key = self._provision_dev_key()
            self._load_functions(specs)
            self._start_event_sources()
        except BaseException:
            self.stop()
            raise
        assert self._http is not None
        return self._http.base_url

    def stop(self) -> None:
        """Stop pollers, schedules, the HTTP server and moto; restore the environment. Idempotent."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=10)
            if thread.is_alive():
                log.warning("%s is still running a handler; leaving it behind", thread.name)
        self._threads.clear()
        if self._http is not None:
            self._http.stop()
            self._http = None
        if self._moto is not None:
            self._moto.stop()
            self._moto = None
        self._endpoint = None
        for name in self._modules:
            sys.modules.pop(name, None)
        self._modules.clear()
        for key, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_environ.clear()
        self._clients.clear()
        _forget_cached_settings()
        self._stopping = threading.Event()
        global _active
        with _active_lock:
            if _active is self:
                _active = None

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.stop()

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Return once every queue that feeds a function is empty (visible, in flight and delayed)
        and no handler is running. Dead-letter queues are not waited on.

        Raises:
            TimeoutError: still busy after `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            generation = self.activity.generation
            if self.activity.busy == 0 and self._queues_empty() and self.activity.generation == generation:
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
        """The functions' environment variables as set in this process (e.g. TABLE_NAME)."""
        return dict(self._environment)

    def invocations(self, logical_id: str) -> int:
        """How many times the function `logical_id` has been invoked since start."""
        return self._runtimes[logical_id].invocations

    def client(self, service: str) -> Any:
        """A boto3 client for `service` pointed at moto (cached; boto3 clients are thread-safe)."""
        if service not in self._clients:
            self._clients[service] = boto3.session.Session().client(
                service,
                endpoint_url=self.moto_endpoint,
                region_name=LOCAL_REGION,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
        return self._clients[service]

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
        # moto's werkzeug server logs every request at INFO.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        serialize_item_operations()  # moto's DynamoDB is not atomic across request threads
        self._moto = ThreadedMotoServer(ip_address=self.host, port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self._endpoint = f"http://{host}:{port}"
        aws = {
            "AWS_ENDPOINT_URL": self._endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": LOCAL_REGION,
            "AWS_REGION": LOCAL_REGION,
        }
        service_endpoints = [key for key in os.environ if key.startswith("AWS_ENDPOINT_URL_")]
        self._set_environ(aws, remove=[*_AWS_OVERRIDES, *service_endpoints])
        # moto's state is process-global: start from nothing, whatever ran before in this process.
        request = urllib.request.Request(f"{self._endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

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
        table = boto3.session.Session().resource(
            "dynamodb", endpoint_url=self.moto_endpoint, region_name=LOCAL_REGION,
            aws_access_key_id="testing", aws_secret_access_key="testing").Table(table_name)
        accounts.create_key(DEV_ACCOUNT, name="local dev key", secret=secret, table=table)
        # The key itself is never logged: `batchinfer local` shows it on the console, tests read `api_key`.
        log.info("local dev API key for account %r stored (%s)", DEV_ACCOUNT,
                 f"from ${DEV_API_KEY_ENV}" if not self.api_key_generated else "generated")
        return secret

    def _set_environ(self, values: Mapping[str, str], remove: list[str] | tuple[str, ...] = ()) -> None:
        for key in [*values, *remove]:
            self._saved_environ.setdefault(key, os.environ.get(key))
        for key in remove:
            os.environ.pop(key, None)
        os.environ.update(values)

    def _service_clients(self) -> dict[str, Any]:
        return {name: self.client(name) for name in ("sqs", "dynamodb", "s3")}

    def _load_functions(self, specs: list[FunctionSpec]) -> None:
        for spec in specs:
            handler = load_handler(spec)
            self._modules.append(handler.__module__)
            self._runtimes[spec.logical_id] = FunctionRuntime(spec, handler, self.activity)

    def _start_event_sources(self) -> None:
        resources = self._started(self._resources)
        routes = []
        for logical_id, runtime in self._runtimes.items():
            for source in runtime.spec.events:
                if isinstance(source, SqsEventSpec):
                    if not source.enabled:
                        continue
                    queue = resources.queue_by_arn(source.queue_arn)
                    self._consumed_queues.append(resources.queue_urls[queue])
                    self._threads.append(
                        SqsPoller(
                            runtime,
                            source,
                            resources.queue_urls[queue],
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
                        log.warning("%s.%s: cron schedule runs every %.0f s locally", logical_id, source.name, CRON_FALLBACK_SECONDS)
                        interval = CRON_FALLBACK_SECONDS
                    assert self.resolver is not None
                    pseudo = self.resolver.pseudo
                    self._threads.append(
                        ScheduleRunner(
                            runtime,
                            source,
                            interval,
                            pseudo["AWS::StackName"],
                            pseudo["AWS::AccountId"],
                            LOCAL_REGION,
                            self._stopping,
                        )
                    )
                else:
                    routes.append(Route.of(runtime, source))
        assert self.resolver is not None
        self._http = HttpApiServer(Router(routes), self.resolver.pseudo["AWS::AccountId"], self.host, self.port)
        self._http.start()
        for thread in self._threads:
            thread.start()

    def _queues_empty(self) -> bool:
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"]
        for url in self._consumed_queues:
            counts = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
            if any(int(counts.get(name, 0)) for name in names):
                return False
        return True


def _forget_cached_settings() -> None:
    """Drop batchinfer's cached Settings so handlers see this stack's environment, not a previous one."""
    settings = sys.modules.get("batchinfer.core.settings")
    if settings is not None and hasattr(settings, "get_settings"):
        settings.get_settings.cache_clear()


__all__ = ["DEFAULT_TEMPLATE", "DEV_ACCOUNT", "DEV_API_KEY_ENV", "LocalStack", "TemplateError"]
