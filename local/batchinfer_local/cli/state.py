"""The state file `batchinfer local` leaves for the commands that act on the running local stack as its
admin (`keys|accounts|buckets ... --local`): where its moto is, its table, bucket and admin identity."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from batchinfer_local import iam
from batchinfer_local.cli.common import CliError

# Where `batchinfer local` leaves its state (default ~/.cache/batchinfer/local.json).
STATE_ENV = "BATCHINFER_LOCAL_STATE"
# What a state file written before these fields existed stands for: the template's default pattern
# and the dev key's account (`stack.DEV_ACCOUNT`).
DEFAULT_USER_BUCKET_PATTERN = "batchinfer-user-*"
DEFAULT_DEV_ACCOUNT = "default"


class LocalState(BaseModel):
    """A running local stack: `base_url` (ending in /v1), its moto endpoint and region, its batch
    `table` and data `bucket`, the admin identity (moto's `testing` pair, not an AWS credential), the
    `user_bucket_pattern` (template parameter UserBucketPattern) and the dev key's `dev_account`."""

    base_url: str
    moto_endpoint: str
    region: str
    table: str
    bucket: str
    access_key_id: str
    secret_access_key: str
    user_bucket_pattern: str = DEFAULT_USER_BUCKET_PATTERN
    dev_account: str = DEFAULT_DEV_ACCOUNT

    def resource(self, service: str) -> Any:
        """A boto3 resource of the local stack's moto, as its admin."""
        return self._session().resource(service, endpoint_url=self.moto_endpoint)

    def client(self, service: str) -> Any:
        """A boto3 client of the local stack's moto, as its admin."""
        return self._session().client(service, endpoint_url=self.moto_endpoint)

    def _session(self) -> Any:
        import boto3

        return boto3.session.Session(
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=self.region,
        )


def state_path() -> Path:
    """The local stack's state file: `$BATCHINFER_LOCAL_STATE`, else ~/.cache/batchinfer/local.json."""
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".cache" / "batchinfer" / "local.json")


def write_state(stack: Any, path: Path) -> None:
    """Leave the running `stack`'s `LocalState` in `path`, for `keys|accounts|buckets --local`."""
    from batchinfer_local.stack import DEV_ACCOUNT

    parameters = stack.resolver.parameters if stack.resolver is not None else {}
    state = LocalState(
        base_url=f"{stack.base_url}/v1",
        moto_endpoint=stack.moto_endpoint,
        region=stack.region,
        table=stack.environment["TABLE_NAME"],
        bucket=stack.buckets["DataBucket"],
        access_key_id=iam.ADMIN.access_key_id,
        secret_access_key=iam.ADMIN.secret_access_key,
        user_bucket_pattern=parameters.get("UserBucketPattern", DEFAULT_USER_BUCKET_PATTERN),
        dev_account=DEV_ACCOUNT,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(state.model_dump_json())


def read_state() -> LocalState:
    """The running local stack's state.

    Raises:
        CliError: no local stack is running (no state file), or the file is not a state file.
    """
    path = state_path()
    if not path.is_file():
        raise CliError(f"error: no local stack is running (no {path}): start one with `make local`")
    try:
        return LocalState.model_validate(json.loads(path.read_text()))
    except ValueError as error:  # not JSON, or a pydantic ValidationError
        raise CliError(
            f"error: {path} is not a local stack's state file ({error}): restart `make local`"
        ) from None
