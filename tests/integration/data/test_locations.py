"""COS clients (data/locations.py `s3_client("cos:<region>")`) against moto's Secrets Manager: the key
pair comes from the configured secret and a rotated pair reaches a client that is already warm."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from batchinfer.core.settings import get_settings
from batchinfer.data import locations
from support.moto_env import Aws

SECRET = "batchinfer/cos"


def keys(client: object) -> tuple[str, str]:
    """The key pair `client` signs its next request with."""
    frozen = client._request_signer._credentials.get_frozen_credentials()  # type: ignore[attr-defined]
    return frozen.access_key, frozen.secret_key


def test_a_rotated_cos_key_pair_reaches_a_warm_client(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given COS configured with its key pair in Secrets Manager, and a client made with it
    secrets = boto3.client("secretsmanager")
    secrets.create_secret(
        Name=SECRET, SecretString=json.dumps({"access_key_id": "AK1", "secret_access_key": "s1"})
    )
    monkeypatch.setenv("COS_ENDPOINT_URL", "https://cos.{region}.myqcloud.com")
    monkeypatch.setenv("COS_CREDENTIALS_SECRET", SECRET)
    get_settings.cache_clear()
    locations._cos_client.cache_clear()
    client = locations.s3_client("cos:ap-guangzhou")
    assert (client.meta.endpoint_url, keys(client)) == (
        "https://cos.ap-guangzhou.myqcloud.com",
        ("AK1", "s1"),
    )

    # When the pair is rotated
    secrets.put_secret_value(
        SecretId=SECRET, SecretString=json.dumps({"access_key_id": "AK2", "secret_access_key": "s2"})
    )

    # Then the client keeps the first pair until it is COS_SECRET_MAX_AGE_S old, then signs with the new one
    assert locations.s3_client("cos:ap-guangzhou") is client
    credentials = client._request_signer._credentials
    started = datetime.now(UTC)
    credentials._time_fetcher = lambda: started + timedelta(seconds=locations.COS_SECRET_MAX_AGE_S - 5)
    assert keys(client) == ("AK1", "s1")
    credentials._time_fetcher = lambda: started + timedelta(seconds=locations.COS_SECRET_MAX_AGE_S + 1)
    assert keys(client) == ("AK2", "s2")
    locations._cos_client.cache_clear()
