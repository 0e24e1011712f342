"""The local stack's API key comes from BATCHINFER_DEV_API_KEY when it is set (else it is generated)."""

from __future__ import annotations

import httpx
import pytest

from batchinfer_local import LocalStack

pytestmark = pytest.mark.timeout(60)


def test_the_dev_key_from_the_environment_is_the_stacks_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHINFER_DEV_API_KEY", "local")
    with LocalStack(port=0) as stack:
        ok = httpx.get(f"{stack.base_url}/v1/batches", headers={"Authorization": "Bearer local"})
        other = httpx.get(f"{stack.base_url}/v1/batches", headers={"Authorization": "Bearer sk-bi-other"})
    assert (stack.api_key, stack.api_key_generated) == ("local", False)
    assert ok.status_code == 200 and ok.json()["data"] == []
    assert other.status_code == 401
