"""boto3 clients of a local stack's moto, by identity: cached, thread-safe, from one session."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config

from . import iam
from .template import LOCAL_REGION

_CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=64)


class MotoClients:
    """Clients pointed at `endpoint()` (moto's, read when a client is made): the admin's by service, each
    function role's by (logical id, service); `forget()` drops them (the stack stopped)."""

    def __init__(self, endpoint: Callable[[], str]) -> None:
        self._endpoint = endpoint
        self._lock = threading.Lock()
        self._session: boto3.session.Session | None = None
        self._admin: dict[str, Any] = {}
        self._functions: dict[tuple[str, str], Any] = {}
        # Each function role's credentials, by logical id (set when the roles are created).
        self.credentials: dict[str, iam.Credentials] = {}

    def admin(self, service: str) -> Any:
        """The admin's client of `service`."""
        with self._lock:
            if service not in self._admin:
                self._admin[service] = self._make(iam.ADMIN, service)
            return self._admin[service]

    def function(self, logical_id: str, service: str) -> Any:
        """The client of `service` with the role credentials of function `logical_id`."""
        with self._lock:
            key = (logical_id, service)
            if key not in self._functions:
                self._functions[key] = self._make(self.credentials[logical_id], service)
            return self._functions[key]

    def of(self, credentials: iam.Credentials, service: str) -> Any:
        """A new client of `service` with `credentials` (not cached)."""
        with self._lock:
            return self._make(credentials, service)

    def forget(self) -> None:
        """Drop the cached clients."""
        self._admin.clear()
        self._functions.clear()

    def _make(self, credentials: iam.Credentials, service: str) -> Any:
        # One session for every client: it loads each service model once.
        if self._session is None:
            self._session = boto3.session.Session(region_name=LOCAL_REGION)
        return credentials.client(
            self._session, service, endpoint_url=self._endpoint(), config=_CLIENT_CONFIG
        )
