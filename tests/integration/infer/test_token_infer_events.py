"""The sample events events/token-infer*.json (for `sam local invoke TokenInferFunction -e ...`) drive the
TokenInferFunction handler of template.yaml, in-process, on the real embedded model."""

from __future__ import annotations

import json

import pytest

from batchinfer.data import accounts
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


def test_model_ready(moto_aws: Aws) -> None:
    response = moto_aws.invoke("TokenInferFunction", load_event("token-infer-model-ready.json"))

    assert (response["statusCode"], json.loads(response["body"])) == (
        200,
        {"name": "smollm2-135m-instruct", "ready": True},
    )
