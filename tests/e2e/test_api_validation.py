"""Every validation code through the HTTP API: the batch goes `validating -> failed` with
`errors.data[]` entries `{code, message, param, line}` (1-based physical lines), and synchronous
problems with the create call itself are a 400 in the OpenAI error envelope.

The file limits are lowered (6 requests, 3,000 bytes, 700 bytes a line, 4 reported errors) so that
small files reach them; the defaults are 50,000 requests and 200 MB.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from support.api_stack import (
    MODEL,
    SCRIPTED,
    api_client,
    chat_line,
    create,
    jsonl,
    new_account,
    upload,
    wait_for,
)
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.timeout(120), DEFAULT.mark]

OK = chat_line("ok", "hi")


def line(custom_id: str = "x", **changes: object) -> str:
    request = json.loads(chat_line(custom_id, "hi"))
    for key, value in changes.items():
        if key.startswith("body_"):
            request["body"][key[5:]] = value
        else:
            request[key] = value
    return json.dumps(request)


def without_model() -> str:
    request = json.loads(OK)
    del request["body"]["model"]
    return json.dumps(request)


CASES: dict[str, tuple[bytes, list[tuple[str, int | None, str | None]]]] = {
    "invalid_json_line": (jsonl(OK, '{"custom_id": "b",'), [("invalid_json_line", 2, None)]),
    "invalid_encoding": (jsonl(OK) + b'{"custom_id": "\xff"}\n', [("invalid_encoding", 2, None)]),
    "missing_required_parameter": (jsonl(without_model()), [("missing_required_parameter", 1, "body.model")]),
    "duplicate_custom_id": (jsonl(OK, OK), [("duplicate_custom_id", 2, "custom_id")]),
    "url_mismatch": (jsonl(line(url="/v1/embeddings")), [("url_mismatch", 1, "url")]),
    "invalid_url": (jsonl(line(url="/v1/chat/completion")), [("invalid_url", 1, "url")]),
    "streaming_unsupported": (jsonl(line(body_stream=True)), [("streaming_unsupported", 1, "body.stream")]),
    "model_mismatch": (jsonl(OK, line("y", body_model=SCRIPTED)), [("model_mismatch", 2, "body.model")]),
    "model_not_found": (jsonl(line(body_model="gpt-9")), [("model_not_found", 1, "body.model")]),
    "empty_file": (b"", [("empty_file", None, None)]),
    "empty_file (blank lines)": (b"\n  \n\r\n", [("empty_file", None, None)]),
    "too_many_tasks": (
        jsonl(*[chat_line(f"r{n}", "hi") for n in range(7)]),
        [("too_many_tasks", None, None)],
    ),
    "file_too_large": (
        jsonl(*[chat_line(f"r{n}", "x" * 500) for n in range(6)]),
        [("file_too_large", None, None)],
    ),
    "line_too_large": (jsonl(OK, chat_line("big", "x" * 800)), [("line_too_large", 2, None)]),
    # Every bad line is reported with its physical line number (blank lines count) ...
    "several errors": (
        jsonl("{", "", line("a", method="GET"), OK, line("b", url="/v1/chat/completion")),
        [("invalid_json_line", 1, None), ("invalid_parameter", 3, "method"), ("invalid_url", 5, "url")],
    ),
    # ... up to the cap
    # (a file with no JSON object in its first lines is refused at upload: see test_api_messages.py)
    "capped": (jsonl(OK, *["{"] * 5), [("invalid_json_line", n, None) for n in range(2, 6)]),
}


@pytest.fixture(scope="module")
def http(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    registry = tmp_path_factory.mktemp("registry") / "models.yaml"
    registry.write_text(
        f"models:\n  {MODEL}:\n    backend: llama_cpp\n  {SCRIPTED}:\n    backend: openai\n"
        "    base_url: http://127.0.0.1:9/v1\n    model: never-called\n"
    )
    limits = {
        "MAX_REQUESTS_PER_FILE": "6",
        "MAX_FILE_BYTES": "3000",
        "MAX_LINE_BYTES": "700",
        "MAX_LINE_ERRORS": "4",
        "MODEL_REGISTRY": str(registry),
    }
    with (
        shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("validation"), limits) as shared,
        api_client(
            shared.stack, new_account("validation", max_active_batches=50, max_creates_per_minute=50)
        ) as client,
    ):
        yield client


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_file_fails_validation_with_every_error_located(http: httpx.Client, name: str) -> None:
    data, expected = CASES[name]
    created = create(http, upload(http, data))
    assert created.status_code == 200, created.text
    batch = wait_for(http, created.json()["id"], timeout=60)
    assert batch["status"] == "failed"
    assert batch["failed_at"] >= batch["created_at"] and batch["in_progress_at"] is None
    assert batch["errors"]["object"] == "list"
    assert [(e["code"], e["line"], e["param"]) for e in batch["errors"]["data"]] == expected
    assert all(e["message"] for e in batch["errors"]["data"])
    assert (batch["output_file_id"], batch["error_file_id"]) == (None, None)


def test_messages_name_the_problem(http: httpx.Client) -> None:
    batch = wait_for(http, create(http, upload(http, CASES["duplicate_custom_id"][0])).json()["id"])
    assert "line 1" in batch["errors"]["data"][0]["message"]
    batch = wait_for(http, create(http, upload(http, CASES["model_not_found"][0])).json()["id"])
    assert "gpt-9" in batch["errors"]["data"][0]["message"]


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"endpoint": "/v1/chat/completions"}, ("input_file_id", "invalid_request")),
        ({"input_file_id": "file-x"}, ("endpoint", "missing_required_parameter")),
        ({"input_file_id": "file-x", "endpoint": "/v1/moderations"}, ("endpoint", "invalid_request")),
        (
            {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "0h"},
            ("completion_window", "invalid_request"),
        ),
        (
            {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "1d"},
            ("completion_window", "invalid_request"),
        ),
        (
            {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "200h"},
            ("completion_window", "invalid_completion_window"),
        ),
        (
            {
                "input_file_id": "file-x",
                "endpoint": "/v1/chat/completions",
                "metadata": {f"k{n}": "v" for n in range(17)},
            },
            ("metadata", "invalid_request"),
        ),
        (
            {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "metadata": {"k": "v" * 513}},
            ("metadata", "invalid_request"),
        ),
        (
            {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "surprise": 1},
            ("surprise", "invalid_request"),
        ),
    ],
)
def test_bad_create_parameters_are_400_in_the_openai_envelope(
    http: httpx.Client, body: dict, expected: tuple[str, str]
) -> None:
    response = http.post("/batches", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == expected
    assert error["type"] == "invalid_request_error" and error["message"]


def test_a_file_of_another_purpose_or_nobody_is_refused(http: httpx.Client) -> None:
    missing = create(http, "file-000000000000000000000000")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "file_not_found"
    output_of_a_batch = http.get("/files", params={"purpose": "batch_output"}).json()["data"]
    assert output_of_a_batch == []  # failed batches have no result files


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "completion_window",
            "2d",
            'completion_window: string "2d" is not a completion window: give whole hours from "1h" to '
            '"168h", e.g. "24h"',
        ),
        (
            "endpoint",
            "/v1/moderations",
            'endpoint: string "/v1/moderations" is not a batch endpoint: use "/v1/chat/completions", '
            '"/v1/completions", "/v1/responses", "/v1/embeddings", or "/v2/models/{model}/infer" for KServe '
            "v2 token requests",
        ),
    ],
)
def test_pattern_rules_are_sentences_not_regexes(
    http: httpx.Client, field: str, value: str, message: str
) -> None:
    body = {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", field: value}
    response = http.post("/batches", json=body)
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": field,
            "code": "invalid_request",
        }
    }


INVALID_FORMAT = "Invalid file format for Batch API. Must be .jsonl: "


@pytest.mark.parametrize(
    "data, problem",
    [
        (
            json.dumps([json.loads(OK)] * 3, indent=2).encode(),
            "it is a JSON array; this must be JSON Lines (one request object per line), "
            "without [ ] or commas.",
        ),
        (
            b"custom_id,prompt\nq1,hello\n",
            "none of its first 2 line(s) is a JSON object (line 1 is not valid JSON); "
            "this must be JSON Lines (one request object per line).",
        ),
        (
            OK.encode("utf-16"),
            "the file is not UTF-8: it starts with a UTF-16 little-endian byte order mark (FF FE). "
            "Save it as UTF-8 JSON Lines.",
        ),
    ],
)
def test_an_upload_that_is_not_json_lines_is_refused_at_once(
    http: httpx.Client, data: bytes, problem: str
) -> None:
    response = http.post(
        "/files", data={"purpose": "batch"}, files={"file": ("in.json", data, "application/json")}
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": INVALID_FORMAT + problem,
            "type": "invalid_request_error",
            "param": "file",
            "code": "invalid_file_format",
        }
    }


def test_models_are_listed_in_openais_shape_and_a_typo_names_the_closest(http: httpx.Client) -> None:
    listed = http.get("/models").json()
    assert [(m["id"], m["object"], m["owned_by"]) for m in listed["data"]] == [
        (MODEL, "model", "llama_cpp"),
        (SCRIPTED, "model", "openai"),
    ]
    assert listed["object"] == "list" and all(isinstance(m["created"], int) for m in listed["data"])
    assert http.get(f"/models/{MODEL}").json() == listed["data"][0]
    typo = http.get("/models/smollm2-135m")
    assert typo.status_code == 404
    assert typo.json()["error"] == {
        "message": f"Model 'smollm2-135m' is not served by this deployment; did you mean '{MODEL}'? "
        "GET /v1/models lists the models.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


def test_a_batch_with_a_mistyped_model_fails_naming_the_closest(http: httpx.Client) -> None:
    data = jsonl(line("a", body_model="smollm2-135m-instruct "))
    batch = wait_for(http, create(http, upload(http, data)).json()["id"], timeout=60)
    assert batch["errors"]["data"][0]["message"] == (
        "Line 1: model 'smollm2-135m-instruct ' is not served by this deployment; did you mean "
        f"'{MODEL}'? GET /v1/models lists the models."
    )


def test_a_key_without_bearer_gets_the_fix(http: httpx.Client) -> None:
    key = http.headers["Authorization"].removeprefix("Bearer ")
    response = httpx.get(f"{http.base_url}/batches", headers={"Authorization": key})
    assert response.status_code == 401
    assert response.json()["error"] == {
        "message": "The Authorization header has no 'Bearer' scheme: send the key as "
        "'Authorization: Bearer YOUR_KEY'.",
        "type": "invalid_request_error",
        "param": None,
        "code": "missing_api_key",
    }


def test_the_openapi_document_lists_models_and_says_where_v2_is(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    assert {"/v1/models", "/v1/models/{model}"} <= set(document["paths"])
    assert "POST /v2/models/{model}/infer" in document["info"]["description"]
    assert (
        document["components"]["schemas"]["OutputExpiresAfter"]["properties"]["seconds"]["maximum"] == 2592000
    )
