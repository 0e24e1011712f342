"""What makes validation fast must not change what it decides: the Bloom-filtered custom_id set is
exact, and the fast path for plain lines agrees with the full checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from batchinfer.validation.jsonl import iter_physical_lines
from batchinfer.validation.file import ChatCompletionBody, FileValidator, SeenIds, _plain_chat_body
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from support.cases import CASES

MODEL = "smollm2-135m-instruct"


# --------------------------------------------------------------------------------------------------
# SeenIds


def test_seen_ids_are_exact_even_when_the_filter_says_maybe_to_everything() -> None:
    # Given a filter sized for 1 id, so that after a few thousand ids it answers "maybe" to all
    seen = SeenIds(1)
    for line in range(1, 10_001):  # 200 kB of records: most of them in the temporary file
        seen.add(f"id-{line}", line)

    # Then a search tells the ids it has from those it has not, with the line of each
    assert seen.maybe_seen("never-added")
    assert seen.first_line("never-added") is None
    assert seen.first_line("id-1") == 1
    assert seen.first_line("id-5000") == 5000
    assert seen.first_line("id-10000") == 10_000  # still in memory, not yet in the file
    assert seen.first_line("id-10001") is None
    seen.close()


def test_seen_ids_without_search_report_line_zero_for_maybe_and_none_for_certainly_new() -> None:
    seen = SeenIds(1000)
    seen.add("a", 7)
    assert seen.first_line("a", exact=False) == 0
    assert seen.first_line("b", exact=False) is None
    assert seen.first_line("a") == 7


def test_seen_ids_keep_ids_that_differ_only_in_case_whitespace_or_surrogates_apart() -> None:
    seen = SeenIds(100)
    for line, custom_id in enumerate(["req-1", "REQ-1", "req-1 ", "a\ud800", "a\udc00"], start=1):
        assert seen.first_line(custom_id) is None
        seen.add(custom_id, line)
    assert [seen.first_line(i) for i in ["req-1", "REQ-1", "req-1 ", "a\ud800", "a\udc00"]] == [1, 2, 3, 4, 5]


def test_duplicates_far_apart_in_a_large_file_name_the_first_line() -> None:
    lines = [json.dumps({"custom_id": f"r-{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}})
             for i in range(20_000)]
    lines.append(lines[3])
    validator = FileValidator("/v1/chat/completions", {MODEL}.__contains__)
    requests = list(validator.validate_stream([("\n".join(lines) + "\n").encode()]))
    assert len(requests) == 20_000
    assert [(e.code, e.line) for e in validator.errors] == [("duplicate_custom_id", 20_001)]
    assert "duplicates line 4" in validator.errors[0].message


# --------------------------------------------------------------------------------------------------
# The fast path


def _run(data: bytes, fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any], int]:
    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(FileValidator, "_feed_plain", lambda self, line: None)
        validator = FileValidator("/v1/chat/completions", {MODEL}.__contains__, max_requests=40, max_errors=30)
        reader = iter_physical_lines((data[i:i + 7] for i in range(0, len(data), 7)), validator.max_line_bytes)
        requests = [r for line in reader if (r := validator.feed(line)) is not None]
        validator.finish(reader.bytes_read)
    return requests, validator.errors, validator.error_count


def _case_files() -> list[Path]:
    return sorted(p for p in CASES.rglob("*.jsonl") if "token-infer" not in str(p))


@pytest.mark.parametrize("path", _case_files(), ids=lambda p: str(p.relative_to(CASES)))
def test_the_fast_path_decides_every_case_file_like_the_full_checks(path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    data = path.read_bytes()
    assert _run(data, True, monkeypatch) == _run(data, False, monkeypatch)


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.integers(2**62, 2**66),
                   st.floats(allow_nan=True), st.text(max_size=3), st.lists(st.text(max_size=2), max_size=5),
                   st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))
MESSAGES = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "robot", ""]),
                           "content": st.one_of(st.text(max_size=5), st.none(), VALUES)}),
    VALUES), max_size=3)
BODIES = st.fixed_dictionaries(
    {"model": st.one_of(st.just(MODEL), st.just(""), VALUES), "messages": st.one_of(MESSAGES, VALUES)},
    optional={key: VALUES for key in ["max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop",
                                      "seed", "stream", "logprobs"]})


@settings(max_examples=3000, deadline=None)
@given(BODIES)
def test_a_body_the_fast_check_accepts_is_one_the_model_accepts(body: dict[str, Any]) -> None:
    if _plain_chat_body(body):
        try:
            ChatCompletionBody.model_validate(body)
        except ValidationError as error:
            pytest.fail(f"fast path accepted {body!r}: {error}")


LINES = st.lists(st.one_of(
    st.builds(lambda cid, body, method, url: json.dumps(
        {"custom_id": cid, "method": method, "url": url, "body": body}, allow_nan=True),
        st.sampled_from(["a", "b", "c", "", 5]), BODIES, st.sampled_from(["POST", "GET"]),
        st.sampled_from(["/v1/chat/completions", "/v1/embeddings"])),
    st.sampled_from(["", "{", "[1]", '{"custom_id": "z", "url": 1}'])), max_size=12)


@settings(max_examples=300, deadline=None)
@given(LINES)
def test_files_of_random_lines_are_decided_alike_with_and_without_the_fast_path(lines: list[str]) -> None:
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert _run(data, True, monkeypatch) == _run(data, False, monkeypatch)
