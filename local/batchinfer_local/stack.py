"""`LocalStack`: batchinfer's template.yaml on one machine (a `TemplateStack` with batchinfer's set-up).

The engine (`template_stack.TemplateStack`) runs any SAM template and knows nothing of batchinfer;
what batchinfer needs before its functions start is passed in as start hooks here: code in this
process sees this stack's settings (batchinfer's cached `Settings` dropped), and the API knows one
key, the local dev API key of account `DEV_ACCOUNT`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import boto3

from .template import LOCAL_REGION, TemplateError
from .template_stack import IAM_ENV, StartHook, TemplateStack

log = logging.getLogger(__name__)

# The repository's template.yaml (this package lives in <repo>/local/batchinfer_local).
DEFAULT_TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"

# The local dev API key: this variable's value, else a generated key (printed by `batchinfer local`).
# It belongs to the account that also owns inbox uploads (Settings.inbox_account_id's default).
DEV_API_KEY_ENV = "BATCHINFER_DEV_API_KEY"
DEV_ACCOUNT = "default"


class LocalStack(TemplateStack):
    """Runs template.yaml locally: moto for DynamoDB/S3/SQS/IAM/STS, each function in its own processes.

    Args: as `TemplateStack`'s (`port`, `redelivery_delay`, `schedule_interval`, then keyword-only
    `parameter_overrides`, `host`, `iam`, `function_environment`, `concurrency`, `start_hooks`);
    `template_path` defaults to the repository's template.yaml and `start_hooks` run after batchinfer's.

    The HTTP API needs a key: `stack.api_key` (account `DEV_ACCOUNT`) is `$BATCHINFER_DEV_API_KEY`, or a
    fresh key when that is unset (`stack.api_key_generated`); None until started, or for a template
    whose functions get no `TABLE_NAME` (not batchinfer's).
    """

    def __init__(
        self,
        template_path: str | Path = DEFAULT_TEMPLATE,
        *args: Any,
        start_hooks: Sequence[StartHook] = (),
        **options: Any,
    ) -> None:
        hooks = [forget_cached_settings, self._store_dev_key, *start_hooks]
        super().__init__(template_path, *args, start_hooks=hooks, **options)
        self.api_key: str | None = None
        self.api_key_generated = False

    def stop(self) -> None:
        """As `TemplateStack.stop`; then code in this process no longer sees this stack's settings."""
        super().stop()
        forget_cached_settings(self)

    def _store_dev_key(self, stack: TemplateStack) -> None:
        """Start hook: the dev API key in the batch table, for a template whose functions get a
        `TABLE_NAME` (batchinfer's)."""
        self.api_key = None
        table_name = stack.environment.get("TABLE_NAME")
        if table_name:
            self.api_key, self.api_key_generated = store_dev_key(table_name, stack.moto_endpoint)


def forget_cached_settings(stack: TemplateStack) -> None:
    """Drop batchinfer's cached Settings so code in this process sees `stack`'s environment, not a
    previous one's (a start hook, and after stopping)."""
    settings = sys.modules.get("batchinfer.core.settings")
    if settings is not None and hasattr(settings, "get_settings"):
        settings.get_settings.cache_clear()


def store_dev_key(table_name: str, moto_endpoint: str) -> tuple[str, bool]:
    """Store the local dev API key for account `DEV_ACCOUNT` in the batch table `table_name` of the moto
    at `moto_endpoint` (as its admin): `$BATCHINFER_DEV_API_KEY`, else a new one. The key, and whether
    it was generated."""
    from batchinfer.data import accounts

    generated = not os.environ.get(DEV_API_KEY_ENV)
    secret = os.environ.get(DEV_API_KEY_ENV) or accounts.new_secret()
    table = (
        boto3.session.Session()
        .resource(
            "dynamodb",
            endpoint_url=moto_endpoint,
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
        f"from ${DEV_API_KEY_ENV}" if not generated else "generated",
    )
    return secret, generated


__all__ = ["DEFAULT_TEMPLATE", "DEV_ACCOUNT", "DEV_API_KEY_ENV", "IAM_ENV", "LocalStack", "TemplateError"]
