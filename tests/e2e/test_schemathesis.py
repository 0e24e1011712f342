"""Schemathesis against the OpenAPI document the local stack serves (`GET /v1/openapi.json`).

Every operation gets generated requests, valid and invalid (with a real API key); no answer may be a
5xx, use a status code or content type the document does not list, or break its response schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from batchinfer_local import LocalStack
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.timeout(300), DEFAULT.mark]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES = 25  # per operation and mode


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    # The only module of its configuration using the dev key's account (`stack.api_key`).
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("schemathesis")) as shared:
        yield shared.stack


@pytest.fixture(scope="module")
def api_schema(stack: LocalStack) -> Any:
    return schemathesis.openapi.from_url(f"{stack.base_url}/v1/openapi.json")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_5xx_and_every_response_matches_the_document(
    stack: LocalStack, api_schema: Any, mode: GenerationMode
) -> None:
    # One Hypothesis run per operation (schemathesis' own pytest loader does not run on pytest 9).
    failures: dict[str, str] = {}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def run(case: Any) -> None:
            case.call_and_validate(
                base_url=stack.base_url,
                headers={"Authorization": f"Bearer {stack.api_key}"},
                checks=CHECKS,
                timeout=30,
            )

        try:
            run()
        except Exception as error:
            failures[operation.label] = str(error)[:2000]
    # Files 5, Batches 6 (create, retrieve, list, cancel, retry, output), Uploads 4 (create, parts,
    # complete, cancel) and GET /v1/uploads/{id}, Models 2, Message Batches 6 (create, list, retrieve,
    # cancel, delete, results)
    assert len(operations) == 24
    assert not failures, "\n\n".join(f"{label}: {text}" for label, text in failures.items())


def test_the_document_describes_the_routes(stack: LocalStack) -> None:
    import httpx

    document = httpx.get(f"{stack.base_url}/v1/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    assert document["components"]["securitySchemes"] == {
        "bearerAuth": {
            "type": "http",
            "description": "an API key: `batchinfer keys create`",
            "scheme": "bearer",
        }
    }
    assert sorted((path, method) for path, item in document["paths"].items() for method in item) == [
        ("/v1/batches", "get"),
        ("/v1/batches", "post"),
        ("/v1/batches/{batch_id}", "get"),
        ("/v1/batches/{batch_id}/cancel", "post"),
        ("/v1/batches/{batch_id}/output", "get"),
        ("/v1/batches/{batch_id}/retry", "post"),
        ("/v1/files", "get"),
        ("/v1/files", "post"),
        ("/v1/files/{file_id}", "delete"),
        ("/v1/files/{file_id}", "get"),
        ("/v1/files/{file_id}/content", "get"),
        ("/v1/messages/batches", "get"),
        ("/v1/messages/batches", "post"),
        ("/v1/messages/batches/{batch_id}", "delete"),
        ("/v1/messages/batches/{batch_id}", "get"),
        ("/v1/messages/batches/{batch_id}/cancel", "post"),
        ("/v1/messages/batches/{batch_id}/results", "get"),
        ("/v1/models", "get"),
        ("/v1/models/{model}", "get"),
        ("/v1/uploads", "post"),
        ("/v1/uploads/{upload_id}", "get"),
        ("/v1/uploads/{upload_id}/cancel", "post"),
        ("/v1/uploads/{upload_id}/complete", "post"),
        ("/v1/uploads/{upload_id}/parts", "post"),
    ]
    create = document["paths"]["/v1/batches"]["post"]
    # 202: a TokenHub-dialect create
    assert sorted(create["responses"]) == ["200", "202", "400", "401", "403", "404", "422", "429", "503"]
