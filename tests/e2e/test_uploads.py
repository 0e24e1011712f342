"""`/v1/uploads` through the local stack's HTTP API (IAM enforced): OpenAI's parts flow with the real
`openai` SDK (`uploads.upload_file_chunked`) and by hand, the presigned PUT that takes only the declared
size and type, and nothing written after complete or cancel reaching a file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from batchinfer_local import LocalStack
from support.api_stack import (
    SCRIPTED,
    HoldableUpstream,
    api_client,
    chat_line,
    jsonl,
    new_account,
    wait_for,
)
from support.stacks import UPSTREAM, SharedStacks

pytestmark = [pytest.mark.timeout(300), UPSTREAM.mark]
# The SDK's parts must fit one request: the Lambda event carries a part base64-encoded (4/3 of it)
# within its 6 MB; 4 MiB parts do (README "Files larger than one request").
PART_SIZE = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def running(
    shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalStack, HoldableUpstream]]:
    with shared_stacks.lease(UPSTREAM, tmp_path_factory.mktemp("uploads")) as shared:
        yield shared.stack, shared.upstream


@pytest.fixture(scope="module")
def stack(running: tuple[LocalStack, HoldableUpstream]) -> LocalStack:
    return running[0]


@pytest.fixture(scope="module")
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    with api_client(stack, new_account("uploader", max_creates_per_minute=100)) as client:
        yield client


def announce(http: httpx.Client, size: int, name: str = "big.jsonl") -> dict:
    response = http.post("/uploads", json={"filename": name, "purpose": "batch", "bytes": size})
    assert response.status_code == 200, response.text
    return response.json()


def add_part(http: httpx.Client, upload_id: str, data: bytes) -> httpx.Response:
    return http.post(
        f"/uploads/{upload_id}/parts", files={"data": ("blob", data, "application/octet-stream")}
    )


def content(http: httpx.Client, file_id: str) -> bytes:
    response = http.get(f"/files/{file_id}/content", follow_redirects=True)
    assert response.status_code == 200, response.text
    return response.content


def test_the_sdks_chunked_upload_of_a_file_larger_than_a_request_becomes_a_batch(
    stack: LocalStack, http: httpx.Client
) -> None:
    # Given a 7 MB batch file (over the 6 MB a request carries): 70 lines of 100 kB prompts
    lines = [chat_line(f"big-{n}", f"{n} " + "x" * 100_000, model=SCRIPTED) for n in range(70)]
    data = jsonl(*lines)
    assert 6 * 1024 * 1024 < len(data) < 2 * PART_SIZE
    client = OpenAI(
        base_url=f"{stack.base_url}/v1", api_key=http.headers["Authorization"].split()[1], max_retries=0
    )

    # When the SDK uploads it in parts, unchanged but for part_size, and a batch is made of it
    upload = client.uploads.upload_file_chunked(
        file=data,
        filename="big.jsonl",
        bytes=len(data),
        mime_type="application/jsonl",
        purpose="batch",
        part_size=PART_SIZE,
        md5=hashlib.md5(data).hexdigest(),
    )
    batch = client.batches.create(
        input_file_id=upload.file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_for(http, batch.id, timeout=240)

    # Then the file holds exactly those bytes and every line was answered once, in order
    assert (upload.status, upload.file.bytes, upload.file.filename) == ("completed", len(data), "big.jsonl")
    assert content(http, upload.file.id) == data
    assert (done["status"], done["request_counts"]) == (
        "completed",
        {"total": 70, "completed": 70, "failed": 0},
    )
    output = [json.loads(line) for line in content(http, done["output_file_id"]).splitlines()]
    assert [line["custom_id"] for line in output] == [f"big-{n}" for n in range(70)]


def test_parts_by_hand_in_the_order_complete_names(http: httpx.Client) -> None:
    # Given an upload of 9 bytes and three parts added out of order
    upload = announce(http, 9)
    added = {chunk: add_part(http, upload["id"], chunk) for chunk in (b"ccc", b"aaa", b"bbb")}
    parts = {chunk: response.json() for chunk, response in added.items()}
    ordered = [parts[b"aaa"]["id"], parts[b"bbb"]["id"], parts[b"ccc"]["id"]]

    # When it is completed wrongly in every way, then rightly, then again
    wrong = {
        "unknown part": http.post(f"/uploads/{upload['id']}/complete", json={"part_ids": ["part_nope"]}),
        "too few bytes": http.post(f"/uploads/{upload['id']}/complete", json={"part_ids": ordered[:2]}),
        "a part twice": http.post(
            f"/uploads/{upload['id']}/complete", json={"part_ids": [*ordered[:2], ordered[0]]}
        ),
        "wrong md5": http.post(
            f"/uploads/{upload['id']}/complete", json={"part_ids": ordered, "md5": "0" * 32}
        ),
        "nothing PUT": http.post(f"/uploads/{upload['id']}/complete", json={}),
    }
    done = http.post(
        f"/uploads/{upload['id']}/complete",
        json={"part_ids": ordered, "md5": hashlib.md5(b"aaabbbccc").hexdigest()},
    )
    again = http.post(f"/uploads/{upload['id']}/complete", json={"part_ids": ordered})
    late_part = add_part(http, upload["id"], b"zzz")

    # Then each part is OpenAI's Upload Part; the file is the parts in complete's order
    part = parts[b"aaa"]
    assert {r.status_code for r in added.values()} == {200}
    assert part == {
        "id": part["id"],
        "object": "upload.part",
        "created_at": part["created_at"],
        "upload_id": upload["id"],
    }
    assert part["id"].startswith("part_") and abs(part["created_at"] - upload["created_at"]) <= 5
    assert {name: (r.status_code, r.json()["error"]["code"]) for name, r in wrong.items()} == {
        "unknown part": (400, "upload_part_not_found"),
        "too few bytes": (400, "upload_size_mismatch"),
        "a part twice": (400, "duplicate_part"),
        "wrong md5": (400, "upload_md5_mismatch"),
        "nothing PUT": (400, "upload_incomplete"),
    }
    assert (
        wrong["too few bytes"].json()["error"]["message"] == "The parts hold 6 bytes, but 9 were announced."
    )
    assert done.status_code == 200, done.text
    assert (done.json()["status"], done.json()["upload_url"]) == ("completed", None)
    assert content(http, done.json()["file"]["id"]) == b"aaabbbccc"
    assert again.json()["file"] == done.json()["file"]
    assert (late_part.status_code, late_part.json()["error"]["code"]) == (409, "upload_not_pending")


def test_the_presigned_put_takes_only_the_declared_size_and_type(http: httpx.Client) -> None:
    # Given an upload of 6 bytes of application/jsonl
    upload = announce(http, 6)
    url, headers = upload["upload_url"], upload["upload_headers"]
    assert headers == {"Content-Type": "application/jsonl", "Content-Length": "6"}

    # When other sizes and types are PUT, then the declared ones
    longer = httpx.put(url, content=b"{}\n{}\n{}\n", headers={"Content-Type": "application/jsonl"})
    shorter = httpx.put(url, content=b"{}\n", headers={"Content-Type": "application/jsonl"})
    other_type = httpx.put(url, content=b"{}\n{}\n", headers={"Content-Type": "text/plain"})
    right = httpx.put(url, content=b"{}\n{}\n", headers=headers)

    # Then S3 refused all but the declared one
    assert [r.status_code for r in (longer, shorter, other_type, right)] == [403, 403, 403, 200]
    assert b"SignatureDoesNotMatch" in longer.content
    done = http.post(f"/uploads/{upload['id']}/complete", json={})
    assert done.status_code == 200, done.text
    assert content(http, done.json()["file"]["id"]) == b"{}\n{}\n"


def test_writes_after_complete_or_cancel_change_no_file(http: httpx.Client) -> None:
    # Given a completed upload whose PUT URL is still valid, and a cancelled one
    completed = announce(http, 6)
    assert httpx.put(
        completed["upload_url"], content=b"{}\n{}\n", headers=completed["upload_headers"]
    ).is_success
    file_id = http.post(f"/uploads/{completed['id']}/complete", json={}).json()["file"]["id"]
    cancelled = announce(http, 6)
    assert http.post(f"/uploads/{cancelled['id']}/cancel").json()["status"] == "cancelled"

    # When both are written to again
    rewrite = httpx.put(completed["upload_url"], content=b"[]\n[]\n", headers=completed["upload_headers"])
    late = httpx.put(cancelled["upload_url"], content=b"[]\n[]\n", headers=cancelled["upload_headers"])
    part = add_part(http, cancelled["id"], b"x")
    complete = http.post(f"/uploads/{cancelled['id']}/complete", json={})

    # Then the file keeps the bytes it was completed with, and the cancelled upload stays cancelled
    assert (rewrite.status_code, late.status_code) == (200, 200)  # staging keys, read by no batch
    assert content(http, file_id) == b"{}\n{}\n"
    assert (part.status_code, complete.status_code) == (409, 409)
    assert http.get(f"/uploads/{cancelled['id']}").json()["status"] == "cancelled"


def test_another_accounts_upload_is_404_on_every_route(stack: LocalStack, http: httpx.Client) -> None:
    # Given account A's pending upload with a part, and account B
    upload = announce(http, 3)
    part = add_part(http, upload["id"], b"abc").json()
    with api_client(stack, new_account("upload-intruder")) as b:
        # When B asks for it in every way
        answers = {
            "retrieve": b.get(f"/uploads/{upload['id']}"),
            "parts": add_part(b, upload["id"], b"xyz"),
            "complete": b.post(f"/uploads/{upload['id']}/complete", json={"part_ids": [part["id"]]}),
            "cancel": b.post(f"/uploads/{upload['id']}/cancel"),
        }
    # Then each is 404 upload_not_found, and A's upload is untouched
    assert {name: (r.status_code, r.json()["error"]["code"]) for name, r in answers.items()} == dict.fromkeys(
        answers, (404, "upload_not_found")
    )
    assert http.get(f"/uploads/{upload['id']}").json()["status"] == "pending"
    done = http.post(f"/uploads/{upload['id']}/complete", json={"part_ids": [part["id"]]})
    assert content(http, done.json()["file"]["id"]) == b"abc"
