"""The zygote's preloading (batchinfer_local/zygote.py)."""

from __future__ import annotations

import botocore.loaders
import botocore.session
import pytest

from batchinfer_local.zygote import SERVICES, share_service_models


def test_sessions_made_after_the_preload_share_its_parsed_service_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(botocore.session, "create_loader", botocore.loaders.create_loader)

    share_service_models()
    loader = botocore.session.Session().get_component("data_loader")

    assert botocore.session.Session().get_component("data_loader") is loader
    parsed = {key[1] for key in loader._cache if key[0] == "load_service_model"}
    assert parsed >= set(SERVICES)
