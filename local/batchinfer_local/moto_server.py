"""moto in server mode for a local stack: started on a free loopback port, patched to behave as AWS
does where the pipeline depends on it (`moto_atomic`, `moto_compat`, `moto_auth`), and stopped with
every process-wide change undone; `ProcessEnviron` sets and restores `os.environ` variables.
"""

from __future__ import annotations

import logging
import os
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from moto.server import ThreadedMotoServer

from . import iam, moto_auth
from .moto_atomic import serialize_item_operations
from .moto_compat import deliver_fairly, query_one_partition, trim_read_stream_records
from .template import LOCAL_REGION

# Variables that would send boto3 elsewhere than moto if left in the environment.
_AWS_OVERRIDES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


class ProcessEnviron:
    """Changes to `os.environ` that `restore()` undoes (each variable back to its first saved value)."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}

    def set(self, values: Mapping[str, str], remove: list[str] | tuple[str, ...] = ()) -> None:
        """Set `values` and unset `remove`, remembering what each variable was."""
        for key in [*values, *remove]:
            self._saved.setdefault(key, os.environ.get(key))
        for key in remove:
            os.environ.pop(key, None)
        os.environ.update(values)

    def restore(self) -> None:
        """Put every changed variable back as it was. Idempotent."""
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved.clear()


class MotoServer:
    """moto's threaded server for one stack; `environ` receives the AWS variables pointing at it."""

    def __init__(self, environ: ProcessEnviron) -> None:
        self._environ = environ
        self._server: ThreadedMotoServer | None = None
        self._auth_saved: tuple[float, int] | None = None
        self.endpoint: str | None = None

    def start(self, iam_enforced: bool, credential_client: Callable[[iam.Credentials, str], Any]) -> str:
        """Start from an empty moto with the admin identity bootstrapped and IAM enforced or not; the
        endpoint, `http://127.0.0.1:<port>`, also set as AWS_ENDPOINT_URL with the admin's credentials."""
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
        self._environ.set({"MOTO_IAM_LOAD_MANAGED_POLICIES": "true"})
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = endpoint = f"http://{host}:{port}"
        aws = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": iam.ADMIN.access_key_id,
            "AWS_SECRET_ACCESS_KEY": iam.ADMIN.secret_access_key,
            "AWS_DEFAULT_REGION": LOCAL_REGION,
            "AWS_REGION": LOCAL_REGION,
        }
        service_endpoints = [key for key in os.environ if key.startswith("AWS_ENDPOINT_URL_")]
        self._environ.set(aws, remove=[*_AWS_OVERRIDES, *service_endpoints])
        # moto's state is process-global: start from nothing, whatever ran before in this process.
        request = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
        # A reset took over 10 s on this 2-core machine under a test run's load: a slow start, not a failure.
        with urllib.request.urlopen(request, timeout=120):
            pass
        iam.bootstrap_admin(endpoint, credential_client)
        iam.set_enforcement(endpoint, iam_enforced)
        return endpoint

    def stop(self) -> None:
        """Stop the server and undo the patches (moto's enforcement and streams are process-wide: in-process
        mock_aws tests find them as they were). Idempotent."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._auth_saved is not None:
            from moto import settings
            from moto.core.authorization import ActionAuthenticatorMixin

            settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count = self._auth_saved
            self._auth_saved = None
            moto_auth.uninstall()
            trim_read_stream_records(False)
            deliver_fairly(False)
            query_one_partition(False)
        self.endpoint = None
