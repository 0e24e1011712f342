"""OpenAPI links (https://spec.openapis.org/oas/v3.1.0#link-object) of the 200 responses: how the id
in one answer feeds the next call (upload a file -> create a batch -> retrieve / cancel it -> download
its results). Clients and tools read them from `GET /v1/openapi.json`; schemathesis follows them in
its stateful tests (tests/e2e/test_api_stateful.py).

Operation ids are the ones Powertools derives from a route (`<function>_<path>_<method>`).
"""

from __future__ import annotations

from typing import Any

from batchinfer.wire.openai import CHAT_ENDPOINT

CREATE_BATCH = "create_batch_v1_batches_post"
RETRIEVE_BATCH = "retrieve_batch_v1_batches__batch_id__get"
CANCEL_BATCH = "cancel_batch_v1_batches__batch_id__cancel_post"
RETRIEVE_FILE = "retrieve_file_v1_files__file_id__get"
DELETE_FILE = "delete_file_v1_files__file_id__delete"
FILE_CONTENT = "file_content_v1_files__file_id__content_get"
COMPLETE_UPLOAD = "complete_upload_v1_uploads__upload_id__complete_post"
CANCEL_UPLOAD = "cancel_upload_v1_uploads__upload_id__cancel_post"


def _link(
    operation_id: str,
    description: str,
    parameters: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    link: dict[str, Any] = {"operationId": operation_id, "description": description}
    if parameters:
        link["parameters"] = parameters
    if body:
        link["requestBody"] = body
    return link


def _of_file(pointer: str) -> dict[str, dict[str, Any]]:
    """The links of a response holding a file id at JSON pointer `pointer`."""
    file_id = {"file_id": f"$response.body#{pointer}"}
    return {
        "RetrieveFile": _link(RETRIEVE_FILE, "the file's metadata", file_id),
        "DownloadFile": _link(FILE_CONTENT, "the file's bytes", file_id),
        "DeleteFile": _link(DELETE_FILE, "delete the file", file_id),
        "CreateBatch": _link(
            CREATE_BATCH,
            "a batch of the file's requests",
            body={
                "input_file_id": f"$response.body#{pointer}",
                "endpoint": CHAT_ENDPOINT,
                "completion_window": "24h",
            },
        ),
    }


def _of_batch(pointer: str = "/id") -> dict[str, dict[str, Any]]:
    """The links of a response holding a batch id at `pointer`."""
    batch_id = {"batch_id": f"$response.body#{pointer}"}
    return {
        "RetrieveBatch": _link(RETRIEVE_BATCH, "the batch's status and counts", batch_id),
        "CancelBatch": _link(CANCEL_BATCH, "cancel the batch", batch_id),
    }


FILE = _of_file("/id")
FILE_PAGE = {"RetrieveFile": _of_file("/first_id")["RetrieveFile"]}
UPLOAD = {
    "CompleteUpload": _link(
        COMPLETE_UPLOAD, "complete the upload once its bytes were PUT", {"upload_id": "$response.body#/id"}
    ),
    "CancelUpload": _link(CANCEL_UPLOAD, "drop the upload", {"upload_id": "$response.body#/id"}),
}
COMPLETED_UPLOAD = _of_file("/file/id")
BATCH = {
    **_of_batch(),
    "DownloadInputFile": _link(
        FILE_CONTENT, "the batch's input file", {"file_id": "$response.body#/input_file_id"}
    ),
}
BATCH_RESULTS = {
    **_of_batch(),
    "DownloadOutputFile": _link(
        FILE_CONTENT, "output.jsonl, once the batch has ended", {"file_id": "$response.body#/output_file_id"}
    ),
    "DownloadErrorFile": _link(
        FILE_CONTENT, "error.jsonl, once the batch has ended", {"file_id": "$response.body#/error_file_id"}
    ),
}
BATCH_PAGE = {"RetrieveBatch": _of_batch("/first_id")["RetrieveBatch"]}
