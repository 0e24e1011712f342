"""API keys, account isolation and the per-account limits, through the HTTP API of the local stack.

- A missing, unknown or revoked key is 401 (before the request is even looked at).
- Keys are created and revoked with the CLI (`batchinfer keys ...`), stored only as SHA-256 hashes.
- Another account's batch or file is 404 and never listed (its uploads: test_uploads.py).
- Over 20 creations a minute or 10 active batches (here lowered per account), 429 with Retry-After;
  N concurrent creates never take an account past its active limit, and the counter stays exact
  while creates and terminal transitions race.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from batchinfer.data import accounts, batches
from batchinfer.data.items import BatchHeader
from batchinfer.data.table import now
from batchinfer.wire.status import BatchStatus, is_terminal
from batchinfer_local import LocalStack
from batchinfer_local.cli import main as cli
from support.api_stack import (
    SCRIPTED,
    HoldableUpstream,
    api_client,
    chat_line,
    create,
    jsonl,
    new_account,
    upload,
    wait_for,
    wait_until,
)
from support.data import batch_header
from support.stacks import ONE_LINE_SHARDS, SharedStacks

pytestmark = [pytest.mark.timeout(120), ONE_LINE_SHARDS.mark]
INVALID = b'{"custom_id": "x"}\n'  # JSON Lines failing validation at once: the batch ends without the model


@pytest.fixture(scope="module")
def running(
    shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalStack, HoldableUpstream]]:
    # A cancel cuts a held request after 1 s (the default grace lets it run up to 10 minutes).
    with shared_stacks.lease(
        ONE_LINE_SHARDS, tmp_path_factory.mktemp("registry"), {"CANCEL_GRACE_SECONDS": "1"}
    ) as shared:
        yield shared.stack, shared.upstream


@pytest.fixture
def stack(running: tuple[LocalStack, HoldableUpstream]) -> Iterator[LocalStack]:
    yield running[0]
    running[1].release()
    running[0].wait_idle(60)


@pytest.fixture
def upstream(running: tuple[LocalStack, HoldableUpstream]) -> HoldableUpstream:
    running[1].rearm()
    return running[1]


# ---- keys ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer sk-bi-not-a-key"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
    ],
)
def test_missing_or_wrong_key_is_401_on_every_route(stack: LocalStack, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=f"{stack.base_url}/v1", headers=headers, timeout=30) as http:
        responses = [
            http.get("/batches"),
            http.get("/batches/batch_0123"),
            http.post("/batches/batch_0123/cancel"),
            http.post("/batches", json={"input_file_id": "file-x", "endpoint": "/v1/chat/completions"}),
            http.post("/batches", json={"bogus": True}),  # invalid too: the key is checked first
            http.get("/files"),
            http.get("/files/file-x"),
            http.get("/files/file-x/content"),
            http.delete("/files/file-x"),
            http.post("/files", files={"file": ("a.jsonl", b"{}")}),
            http.post("/uploads", json={"filename": "a.jsonl", "purpose": "batch", "bytes": 3}),
        ]
        document = http.get("/openapi.json")
    for response in responses:
        assert response.status_code == 401, (response.request.url, response.text)
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="batchinfer"'
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["code"] == ("missing_api_key" if "Bearer sk" not in str(headers) else "invalid_api_key")
    assert document.status_code == 200  # the API's description needs no key


def test_cli_creates_and_revokes_keys_stored_only_as_hashes(
    stack: LocalStack, capsys: pytest.CaptureFixture[str]
) -> None:
    table = ["--table", stack.environment["TABLE_NAME"], "--endpoint-url", stack.moto_endpoint]
    # Given a key made by `batchinfer keys create`
    assert cli(["keys", "create", "--account", "cli-acct", "--name", "ci", *table]) == 0
    secret = capsys.readouterr().out.strip().splitlines()[-1]
    [key] = accounts.list_keys("cli-acct")
    with api_client(stack, secret) as http:
        # When it is used, then revoked by id, then used again
        before = http.get("/batches")
        assert cli(["keys", "revoke", key.key_id, *table]) == 0
        after = http.get("/batches")
    # Then it worked until revoked; the table holds its hash, never the key
    assert secret.startswith("sk-bi-") and len(secret) == 49
    assert before.status_code == 200 and before.json()["data"] == []
    assert after.status_code == 401 and after.json()["error"]["code"] == "invalid_api_key"
    items = stack.dynamodb.scan(TableName=stack.environment["TABLE_NAME"])["Items"]
    assert secret not in str(items)
    assert {"S": f"KEY#{hashlib.sha256(secret.encode()).hexdigest()}"} in [i["PK"] for i in items]
    assert cli(["keys", "revoke", "key_0000000000000000", *table]) == 1


def test_dev_key_belongs_to_the_default_account(stack: LocalStack) -> None:
    key = accounts.authenticate(stack.api_key)
    assert key is not None and key.account_id == "default"
    assert stack.api_key_generated is True and stack.api_key.startswith("sk-bi-")


# ---- isolation -------------------------------------------------------------------------------------


def test_another_accounts_batches_and_files_are_404_and_never_listed(stack: LocalStack) -> None:
    # Given account A's file and batch
    with api_client(stack, new_account("iso-a")) as a, api_client(stack, new_account("iso-b")) as b:
        file_id = upload(a, INVALID)
        batch_id = create(a, file_id).json()["id"]
        # When account B asks for them in every way
        answers = {
            "retrieve": b.get(f"/batches/{batch_id}"),
            "cancel": b.post(f"/batches/{batch_id}/cancel"),
            "file": b.get(f"/files/{file_id}"),
            "content": b.get(f"/files/{file_id}/content"),
            "delete": b.delete(f"/files/{file_id}"),
            "create": create(b, file_id),
        }
        listed = (
            b.get("/batches").json(),
            b.get("/files").json(),
            b.get("/batches", params={"after": batch_id}).json(),
            b.get("/files", params={"after": file_id, "order": "asc"}).json(),
        )
        # Then every answer is 404 and nothing is listed, while A still sees both
        assert {name: r.status_code for name, r in answers.items()} == dict.fromkeys(answers, 404)
        assert answers["retrieve"].json()["error"] == {
            "message": f"No batch found with id '{batch_id}'.",
            "type": "invalid_request_error",
            "param": "batch_id",
            "code": "batch_not_found",
        }
        assert answers["file"].json()["error"]["code"] == "file_not_found"
        assert [page["data"] for page in listed] == [[], [], [], []]
        assert a.get(f"/files/{file_id}").status_code == 200
        assert [batch["id"] for batch in a.get("/batches").json()["data"]] == [batch_id]


# ---- limits ----------------------------------------------------------------------------------------


def test_over_the_creations_per_minute_is_429_with_retry_after(stack: LocalStack) -> None:
    # Given an account allowed 3 creations a minute (and away from a minute boundary)
    if time.time() % 60 > 50:
        time.sleep(61 - time.time() % 60)
    with api_client(stack, new_account("rate-acct", max_creates_per_minute=3, max_active_batches=50)) as http:
        file_id = upload(http, INVALID)
        # When it creates 4 batches
        answers = [create(http, file_id) for _ in range(4)]
        seconds_left = 60 - int(time.time()) % 60
    # Then the 4th is refused until the next minute
    assert [r.status_code for r in answers] == [200, 200, 200, 429]
    assert answers[3].json()["error"] == {
        "message": "Rate limit reached: 3 batch creations per minute.",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert abs(int(answers[3].headers["Retry-After"]) - seconds_left) <= 1


def test_active_limit_is_429_and_frees_up_when_a_batch_ends(
    stack: LocalStack, upstream: HoldableUpstream
) -> None:
    with api_client(stack, new_account("active-acct", max_active_batches=4)) as http:
        # Given one batch held at the model (later batches' requests are held too: they stay in_progress)
        held = create(http, upload(http, jsonl(chat_line("h", "HOLD", model=SCRIPTED)))).json()
        wait_until(upstream.held.is_set, what="the HOLD request")
        waiting = upload(http, jsonl(chat_line("w", "HOLD waits", model=SCRIPTED)))

        # When 10 creates race for the 3 free places
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda _: create(http, waiting), range(10)))

        # Then exactly 3 are accepted, the others are 429 with Retry-After, and the count is exact
        codes = sorted(r.status_code for r in answers)
        assert codes == [200] * 3 + [429] * 7
        refused = next(r for r in answers if r.status_code == 429)
        assert refused.headers["Retry-After"] == "30"
        assert refused.json()["error"]["code"] == "active_batch_limit_exceeded"
        assert accounts.active_batches("active-acct") == 4

        # When one batch ends (cancelled), a create succeeds again; when all end, the count is 0
        accepted = [r.json()["id"] for r in answers if r.status_code == 200]
        http.post(f"/batches/{accepted[0]}/cancel").raise_for_status()
        wait_for(http, accepted[0], {"cancelled"})
        assert accounts.active_batches("active-acct") == 3
        again = create(http, waiting)
        assert again.status_code == 200
        for batch_id in [held["id"], *accepted[1:], again.json()["id"]]:
            http.post(f"/batches/{batch_id}/cancel").raise_for_status()
        for batch_id in [held["id"], *accepted[1:], again.json()["id"]]:
            wait_for(http, batch_id, {"cancelled"})
        assert accounts.active_batches("active-acct") == 0


def test_counter_stays_exact_while_creates_and_terminal_transitions_race(stack: LocalStack) -> None:
    account, limit = "race-acct", 10

    def header(n: int) -> BatchHeader:
        return batch_header(account, created_at=now(), input_file_id=f"file-{n}")

    def try_create(n: int) -> str | None:
        item = header(n)
        try:
            return item.id if batches.create_limited(item, max_active=limit, max_per_minute=None) else None
        except accounts.LimitExceeded:
            return None

    # Given 40 concurrent creates against a limit of 10
    with ThreadPoolExecutor(16) as pool:
        first = [b for b in pool.map(try_create, range(40)) if b]
    assert len(first) == limit
    assert accounts.active_batches(account) == limit

    # When every batch is ended twice over (duplicate deliveries) while 30 more creates race
    def end(batch_id: str) -> None:
        batches.transition(batch_id, BatchStatus.CANCELLING)
        batches.transition(batch_id, BatchStatus.CANCELLED)

    with ThreadPoolExecutor(16) as pool:
        ends = [pool.submit(end, b) for b in first + first]
        second = [b for b in pool.map(try_create, range(40, 70)) if b]
        for future in ends:
            future.result()

    # Then the counter equals the batches that are really open, never more than the limit
    open_now = [b for b in first + second if not is_terminal(batches.get(b).status)]
    assert all(batches.get(b).status == BatchStatus.CANCELLED for b in first)
    assert len(open_now) == len(second) <= limit
    assert accounts.active_batches(account) == len(open_now)
