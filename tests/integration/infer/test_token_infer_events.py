"""The sample events events/token-infer*.json (for `sam local invoke TokenInferFunction -e ...`) drive the
TokenInferFunction handler of template.yaml, in-process, on the real embedded model."""

from __future__ import annotations

import json

import pytest

from support.moto_env import Aws, load_event

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]


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
