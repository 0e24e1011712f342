"""The web console (/console/) in a real Chromium (Debian's `chromium`, driven by Playwright) against the
shared local stack on the embedded model: sign in, the list, a batch's page refreshing by itself and
cancelled, the new-batch form, downloads, validation errors, and another account's view.

Every page is screenshotted into build/test-artifacts/console/ and must raise no JavaScript error (nor log
one: the only console errors allowed are the HTTP errors a test provokes on purpose).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    Playwright,
    expect,
    sync_playwright,
)

from batchinfer_local import LocalStack
from support.api_stack import MODEL, api_client, chat_line, create, jsonl, new_account, upload, wait_for
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(240), DEFAULT.mark]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "build" / "test-artifacts" / "console"
CHROMIUM = os.environ.get("BATCHINFER_CHROMIUM", "/usr/bin/chromium")
# Headless, and none of Chromium's own background connections (refused on closed networks).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KEY_STORAGE = "batchinfer.apiKey"
WAIT_MS = 60_000
# A loaded machine answers a request in seconds: Playwright's 5 s default for assertions is too short.
TIMEOUT_MS = 30_000
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def chromium_path() -> str:
    """Chromium's executable; missing, the module fails in CI and is skipped elsewhere."""
    if Path(CHROMIUM).is_file():
        return CHROMIUM
    advice = f"no Chromium at {CHROMIUM}: `sudo apt-get install chromium`, or set BATCHINFER_CHROMIUM"
    if os.environ.get("CI"):
        pytest.fail(advice)
    pytest.skip(advice)


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Browser]:
    with sync_playwright() as playwright:
        yield _launch(playwright, chromium_path)


def _launch(playwright: Playwright, path: str) -> Browser:
    return playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)


@pytest.fixture(scope="module")
def stack(
    browser: Browser, shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    # Live counts every 0.25 s (several steps even on a fast machine); a cancel cuts the requests at the
    # model after 1 s (the running batch's long answers are not waited for).
    environment = {"PROGRESS_SECONDS": "0.25", "CANCEL_GRACE_SECONDS": "1"}
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("console"), environment) as shared:
        yield shared.stack


@pytest.fixture(scope="module")
def key(stack: LocalStack) -> str:
    return new_account("console", max_active_batches=20, max_creates_per_minute=60)


@pytest.fixture(scope="module")
def http(stack: LocalStack, key: str) -> Iterator[httpx.Client]:
    with api_client(stack, key) as client:
        yield client


class Watched:
    """A page and what went wrong in it: uncaught exceptions and console errors, except the failed
    responses a test expects (`allow`)."""

    def __init__(self, page: Page, url: str) -> None:
        self.page, self.url, self.errors = page, url, []
        self.allowed: set[int] = set()
        page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        page.on("console", self._console)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        status = re.match(
            r"Failed to load resource: the server responded with a status of (\d+)", message.text
        )
        if status is None or int(status.group(1)) not in self.allowed:
            self.errors.append(f"console: {message.text}")

    def allow(self, *statuses: int) -> None:
        self.allowed.update(statuses)

    def sign_in(self, key: str, hash_: str = "") -> None:
        """Open the console (at `hash_`) and sign in with `key`."""
        self.page.goto(self.url + hash_)
        self.page.fill("#api-key", key)
        self.page.click("button[type=submit]")
        expect(self.page.locator("#sign-out")).to_be_visible()

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)


@pytest.fixture(scope="module")
def context(browser: Browser, stack: LocalStack) -> Iterator[BrowserContext]:
    # One context for the module: its HTTP cache keeps the console's files from one test to the next.
    context = browser.new_context(viewport={"width": 1100, "height": 760}, accept_downloads=True)
    context.set_default_timeout(TIMEOUT_MS)
    yield context
    context.close()


@pytest.fixture
def watched(context: BrowserContext, stack: LocalStack) -> Iterator[Watched]:
    # A new tab per test: its own sessionStorage, so each test signs in.
    page = context.new_page()
    watched = Watched(page, f"{stack.base_url}/console/")
    yield watched
    page.close()
    assert watched.errors == []


def rows(page: Page) -> list[str]:
    return page.locator("#batches tbody tr").evaluate_all("rows => rows.map(row => row.dataset.id)")


def test_a_wrong_key_is_refused_then_the_right_one_signs_in_and_out(watched: Watched, key: str) -> None:
    page, wrong = watched.page, "sk-batchinfer-wrong-key-0000"
    watched.allow(401)

    # Given the console's sign-in page
    page.goto(watched.url)
    expect(page.get_by_label("API key")).to_have_attribute("type", "password")
    watched.shot("sign-in")

    # When a wrong key is given, then the right one
    page.fill("#api-key", wrong)
    page.click("button[type=submit]")
    expect(page.locator("#message")).to_have_text("Incorrect API key provided: sk-bat...0000.")
    assert page.evaluate(f"sessionStorage.getItem('{KEY_STORAGE}')") is None
    page.fill("#api-key", key)
    page.click("button[type=submit]")

    # Then the list opens, the key in sessionStorage only (never in the URL, nor in localStorage)
    expect(page.get_by_role("heading", name="Batches")).to_be_visible()
    assert page.evaluate(f"sessionStorage.getItem('{KEY_STORAGE}')") == key
    assert page.evaluate("localStorage.length") == 0 and key not in page.url
    # ... and signing out forgets it
    page.click("#sign-out")
    expect(page.locator("#message")).to_have_text("Signed out.")
    expect(page.locator("#api-key")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0


def test_the_form_creates_a_batch_whose_page_follows_it_to_its_end_and_downloads_its_output(
    watched: Watched, http: httpx.Client, key: str, tmp_path: Path
) -> None:
    page = watched.page
    source = tmp_path / "two.jsonl"
    source.write_bytes(
        jsonl(chat_line("a", "Say hi.", max_tokens=4), chat_line("b", "Say bye.", max_tokens=4))
    )

    # Given the new-batch form, a file picked and a name
    watched.sign_in(key, "#/new")
    page.set_input_files("#file", source)
    expect(page.locator("#chosen")).to_have_text(f"two.jsonl, {source.stat().st_size} bytes")
    page.fill("#batch-name-input", "from the form")
    watched.shot("new-batch")

    # When it is created
    page.click("#create")

    # Then the batch's page opens and follows it, by itself, to its end
    page.wait_for_url(re.compile(r"#/batches/batch_"))
    batch_id = page.locator("#batch-id").inner_text()
    expect(page.locator("#status")).to_have_text("completed", timeout=WAIT_MS)
    batch = http.get(f"/batches/{batch_id}").json()
    assert (batch["name"], batch["endpoint"], batch["completion_window"]) == (
        "from the form",
        "/v1/chat/completions",
        "24h",
    )
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    expect(page.locator("#progress .count")).to_have_text("2 / 2")
    expect(page.locator("#counts")).to_contain_text("Completed2")
    watched.shot("completed-batch")
    # ... and reads it no more once it has ended
    reads: list[str] = []
    page.on("request", lambda request: reads.append(request.url))
    page.wait_for_timeout(2500)
    assert [url for url in reads if batch_id in url] == []

    # When its output and its input are downloaded, the bytes are the API's
    with page.expect_download() as output:
        page.click("#download-output")
    assert output.value.suggested_filename == f"{batch_id}_output.jsonl"
    assert (
        Path(output.value.path()).read_bytes()
        == http.get(f"/files/{batch['output_file_id']}/content").content
    )
    with page.expect_download() as given:
        page.click("#download-input")
    assert Path(given.value.path()).read_bytes() == source.read_bytes()
    assert page.locator("#actions > *").all_inner_texts() == ["Download output", "Download input"]


def test_a_failed_batch_shows_its_validation_errors(watched: Watched, http: httpx.Client, key: str) -> None:
    # Given a batch whose file fails validation
    bad = json.loads(chat_line("b", "hi"))
    bad["url"] = "/v1/chat/completion"
    file_id = upload(http, jsonl(chat_line("a", "hi"), "{", json.dumps(bad)))
    batch = wait_for(http, create(http, file_id).json()["id"], timeout=60)
    assert batch["status"] == "failed"

    # When its page is opened
    watched.sign_in(key, f"#/batches/{batch['id']}")

    # Then it shows each error's line, code and message, as the API gives them
    expect(page_status := watched.page.locator("#status")).to_have_text("failed")
    shown = watched.page.locator("#validation-errors tbody tr").evaluate_all(
        "rows => rows.map(row => [...row.cells].map(cell => cell.innerText))"
    )
    assert shown == [[str(e["line"]), e["code"], e["message"]] for e in batch["errors"]["data"]]
    assert [row[:2] for row in shown] == [["2", "invalid_json_line"], ["3", "invalid_url"]]
    assert page_status.get_attribute("class") == "status status-failed"
    assert watched.page.locator("#actions > *").all_inner_texts() == ["Download input"]
    watched.shot("failed-batch")


def test_the_list_pages_through_every_dialect_newest_first_and_filters_by_status(
    watched: Watched, http: httpx.Client, key: str
) -> None:
    # Given a failed OpenAI batch, then an Anthropic Message Batch
    failed = create(http, upload(http, jsonl(chat_line("a", "hi"), "{"))).json()["id"]
    wait_for(http, failed, timeout=60)
    request = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    response = http.post("/messages/batches", json={"requests": [{"custom_id": "m", "params": request}]})
    message_batch = response.raise_for_status().json()["id"]

    # When the list is opened, two batches a page, and paged through with "More"
    page = watched.page
    watched.sign_in(key, "#/?limit=2")
    expect(page.locator(f"#batches tr[data-id='{failed}']")).to_be_visible()
    listed = http.get("/batches").json()["data"]
    assert rows(page) == [message_batch, failed] == [b["id"] for b in listed[:2]]
    while page.locator("#more").is_visible():
        shown = len(rows(page))
        page.click("#more")
        expect(page.locator("#batches tbody tr")).to_have_count(min(shown + 2, len(listed)))

    # Then it holds the account's batches in the API's order, newest first, each dialect's
    assert rows(page) == [b["id"] for b in listed]
    assert [b["created_at"] for b in listed] == sorted((b["created_at"] for b in listed), reverse=True)
    cells = page.locator(f"#batches tr[data-id='{message_batch}'] td").all_inner_texts()
    assert (cells[0], cells[5], cells[6]) == (message_batch, "/v1/messages", MODEL)
    cells = page.locator(f"#batches tr[data-id='{failed}'] td").all_inner_texts()
    assert (cells[1], cells[2], cells[3]) == ("failed", "0 / 0", "0")
    wait_for(http, message_batch, timeout=60)
    watched.shot("batch-list")

    # When filtered by status, only those batches remain
    page.select_option("#status-filter", "failed")
    assert rows(page) == [b["id"] for b in listed if b["status"] == "failed"]


def _counts_seen(page: Page, timeout_s: float) -> list[str]:
    """The "done / total" texts of a batch's page, read from the page (never reloaded) every 0.1 s
    until one is strictly between 0 and the total after a lower one (the counts moved by
    themselves), or `timeout_s`."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = page.locator("#progress .count").inner_text()
        if not seen or seen[-1] != text:
            seen.append(text)
        done, total = (int(n) for n in text.split(" / "))
        if total and 0 < done < total and len(seen) >= 2:
            return seen
        page.wait_for_timeout(100)
    return seen


@pytest.fixture
def running_batch(http: httpx.Client) -> Iterator[str]:
    """A batch whose answers end one after another (ever longer answers: the last two outlast the test,
    cut by its cancel); cancelled through the API at the end whatever the test did, so that no one
    waits for its long answers."""
    count = "Count from 1 to 1000, separated by commas."
    lines = [chat_line(f"r{n}", count, max_tokens=tokens) for n, tokens in enumerate((8, 64, 512, 512))]
    batch_id = create(http, upload(http, jsonl(*lines))).json()["id"]
    yield batch_id
    http.post(f"/batches/{batch_id}/cancel")  # 200, or 409 once it has ended: either way it ends soon


def test_a_running_batch_moves_by_itself_and_is_cancelled(
    watched: Watched, http: httpx.Client, key: str, running_batch: str
) -> None:
    # Given a batch whose answers end one after another
    batch_id = running_batch

    # When its page is watched
    watched.sign_in(key, f"#/batches/{batch_id}")
    seen = _counts_seen(watched.page, 90)

    # Then its counts moved without a reload, and it showed rates
    done, total = (int(n) for n in seen[-1].split(" / "))
    assert total == 4 and 0 < done < 4, seen
    expect(watched.page.locator("#status")).to_have_text("in progress")
    assert float(watched.page.locator("#requests-per-second").inner_text()) > 0
    watched.shot("running-batch")

    # When what is done is downloaded while it runs (its one shard may not have committed a part yet)
    with watched.page.expect_download() as done:
        watched.page.click("#download-done")
    assert done.value.suggested_filename == f"{batch_id}_partial_output.jsonl"
    partial = Path(done.value.path()).read_bytes()

    # When it is cancelled, confirmed in the dialog
    watched.page.click("#cancel")
    expect(watched.page.locator("#confirm-cancel")).to_be_visible()
    watched.page.click("#confirm-cancel-yes")

    # Then the API shows it cancelling (or already cancelled), and so does the page
    expect(watched.page.locator("#message")).to_have_text(
        re.compile(rf"Batch {batch_id} is cancell(ing|ed)\.")
    )
    assert http.get(f"/batches/{batch_id}").json()["status"] in ("cancelling", "cancelled")
    expect(watched.page.locator("#status")).to_have_text(re.compile("cancell(ing|ed)"))
    # ... and what was downloaded while it ran begins its final output, line for line
    expect(watched.page.locator("#status")).to_have_text("cancelled", timeout=WAIT_MS)
    final = http.get(f"/files/{http.get(f'/batches/{batch_id}').json()['output_file_id']}/content").content
    assert final.startswith(partial) and (partial == b"" or partial.endswith(b"\n"))


def test_another_account_sees_none_of_these_batches(watched: Watched, http: httpx.Client) -> None:
    watched.allow(404)
    theirs = http.get("/batches").json()["data"][0]["id"]

    # Given a second account's key
    watched.sign_in(new_account("console-other"))

    # Then its list is empty, and the first account's batch is not found
    expect(watched.page.locator("#empty")).to_have_text("No batches yet. Create one.")
    assert rows(watched.page) == []
    watched.page.goto(f"{watched.url}#/batches/{theirs}")
    expect(watched.page.locator("#message")).to_have_text(f"No batch found with id '{theirs}'.")
    assert watched.page.locator("#status").count() == 0
    watched.shot("other-account")


def test_a_narrow_screen_shows_each_batch_as_labelled_lines(watched: Watched, key: str) -> None:
    # Given a 375 px wide screen
    watched.page.set_viewport_size({"width": 375, "height": 740})

    # When the list is opened
    watched.sign_in(key)
    expect(watched.page.locator("#batches tbody tr").first).to_be_visible()

    # Then nothing is wider than the screen
    assert watched.page.evaluate("document.documentElement.scrollWidth") <= 375
    watched.shot("batch-list-narrow")
