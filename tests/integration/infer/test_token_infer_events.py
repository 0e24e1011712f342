"""The sample events events/token-infer*.json (for `sam local invoke TokenInferFunction -e ...`) drive the
TokenInferFunction handler of template.yaml, in-process, on the real embedded model."""

from __future__ import annotations

import json

import pytest

from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, inflight, keys
from support.moto_env import Aws, load_event

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]
# The infer events carry the API events' key (store it with `batchinfer keys` for `sam local invoke`).
SAMPLE_KEY = "sk-bi-sample-key-for-sam-local-invoke"


@pytest.fixture(autouse=True)
def _sample_key(moto_aws: Aws) -> None:
    accounts.create_key("default", secret=SAMPLE_KEY)


def test_the_mindie_sample_request_is_answered(moto_aws: Aws) -> None:
    response = moto_aws.invoke("TokenInferFunction", load_event("token-infer.json"))

    assert (response["statusCode"], response["headers"]["Content-Type"]) == (200, "application/json")
    answer = json.loads(response["body"])
    [output] = answer["outputs"]
    assert (answer["id"], output["name"], output["datatype"]) == ("42", "output0", "UINT32")
    assert output["shape"] == [1, len(output["data"])] and 1 <= len(output["data"]) <= 20


def test_an_id_outside_the_vocabulary_is_a_400(moto_aws: Aws) -> None:
    response = moto_aws.invoke("TokenInferFunction", load_event("token-infer-invalid.json"))

    assert (response["statusCode"], json.loads(response["body"])) == (
        400,
        {
            "error": (
                "inputs[0].data[1] must be a token id of the model's vocabulary, an integer in [0, 49152), "
                "got integer 49152"
            )
        },
    )


def test_model_ready_loads_nothing_without_a_key(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the readiness event without its key, and a backend that must not be touched
    event = load_event("token-infer-model-ready.json")
    del event["headers"]["authorization"]
    monkeypatch.setattr("batchinfer.infer.app.model_limits", lambda backend: pytest.fail("model loaded"))
    response = moto_aws.invoke("TokenInferFunction", event)
    assert (response["statusCode"], json.loads(response["body"])) == (
        401,
        {"error": "no API key: send it as 'Authorization: Bearer YOUR_KEY'"},
    )


def test_model_ready_waits_for_a_slot_of_the_account_s_share(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the account's one /v2 slot held by another request
    monkeypatch.setenv("MAX_INFER_IN_FLIGHT", "1")
    get_settings.cache_clear()
    assert inflight.acquire(keys.infer_slots("default"), limit=1, owner="other", lease_s=60) == 0
    monkeypatch.setattr("batchinfer.infer.app.model_limits", lambda backend: pytest.fail("model loaded"))
    response = moto_aws.invoke("TokenInferFunction", load_event("token-infer-model-ready.json"))
    assert (response["statusCode"], response["headers"].get("Retry-After")) == (429, "1")


def test_model_ready(moto_aws: Aws) -> None:
    response = moto_aws.invoke("TokenInferFunction", load_event("token-infer-model-ready.json"))

    assert (response["statusCode"], json.loads(response["body"])) == (
        200,
        {"name": "smollm2-135m-instruct", "ready": True},
    )
