"""template.yaml declares the token endpoint as its own image function behind the same HTTP API."""

from __future__ import annotations

from pathlib import Path

from batchinfer_local.functions import handler_location
from batchinfer_local.template import load_template, merge_function_globals

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = load_template(REPO / "template.yaml")


def test_token_infer_function_is_an_image_on_the_http_api() -> None:
    function = merge_function_globals(TEMPLATE, "TokenInferFunction")
    resource = TEMPLATE["Resources"]["TokenInferFunction"]

    assert (function["PackageType"], function.get("Runtime"), function.get("Layers")) == ("Image", None, None)
    assert (function["Timeout"], function["MemorySize"]) == (29, 3008)
    assert {
        name: (e["Type"], e["Properties"]["Method"], e["Properties"]["Path"], e["Properties"]["ApiId"])
        for name, e in function["Events"].items()
    } == {
        "V2Root": ("HttpApi", "GET", "/v2", {"Ref": "HttpApi"}),
        "V2": ("HttpApi", "ANY", "/v2/{proxy+}", {"Ref": "HttpApi"}),
    }
    assert resource["Metadata"] == {
        "Dockerfile": "functions/Dockerfile",
        "DockerContext": ".",
        "DockerTag": "python3.12-v1",
    }


def test_the_image_carries_the_handler_the_local_stack_runs() -> None:
    function = merge_function_globals(TEMPLATE, "TokenInferFunction")
    metadata = TEMPLATE["Resources"]["TokenInferFunction"]["Metadata"]
    dockerfile = (REPO / metadata["Dockerfile"]).read_text()

    assert handler_location(REPO, "TokenInferFunction", function, metadata) == (
        REPO / "functions" / "token_infer" / "app.py",
        "lambda_handler",
    )
    assert "COPY functions/token_infer/app.py ${LAMBDA_TASK_ROOT}/token_infer/app.py" in dockerfile
    assert function["ImageConfig"]["Command"] == ["token_infer/app.lambda_handler"]
    assert "COPY layers/shared/batchinfer ${LAMBDA_TASK_ROOT}/batchinfer" in dockerfile
