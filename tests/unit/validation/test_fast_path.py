"""What makes validation fast must not change what it decides: the fast path for plain lines agrees
with the full checks (the chat body's fast check: tests/unit/wire/test_chat.py; the Bloom-filtered
custom_id set: test_seen_ids.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchinfer.validation.envelope import PLAIN_ENVELOPE_FIELDS, Envelope
from batchinfer.validation.file import FileValidator
from batchinfer.validation.jsonl import iter_physical_lines
from support.cases import CASES
from support.chat_bodies import BODIES, MODEL


def test_the_envelope_fast_check_covers_every_field_of_the_envelope() -> None:
    # `plain_envelope` checks the fields it lists; a field added to `Envelope` needs its check too.
    assert set(Envelope.model_fields) == PLAIN_ENVELOPE_FIELDS


def _run(data: bytes, fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any], int]:
    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(FileValidator, "_feed_plain", lambda self, line: None)
        validator = FileValidator(
            "/v1/chat/completions", {MODEL}.__contains__, max_requests=40, max_errors=30
        )
        reader = iter_physical_lines(
            (data[i : i + 7] for i in range(0, len(data), 7)), validator.max_line_bytes
        )
        requests = [r for line in reader if (r := validator.feed(line)) is not None]
        validator.finish(reader.bytes_read)
    return requests, validator.errors, validator.error_count


def _case_files() -> list[Path]:
    return sorted(p for p in CASES.rglob("*.jsonl") if "token-infer" not in str(p))


@pytest.mark.parametrize("path", _case_files(), ids=lambda p: str(p.relative_to(CASES)))
def test_the_fast_path_decides_every_case_file_like_the_full_checks(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = path.read_bytes()
    assert _run(data, True, monkeypatch) == _run(data, False, monkeypatch)


LINES = st.lists(
    st.one_of(
        st.builds(
            lambda cid, body, method, url: json.dumps(
                {"custom_id": cid, "method": method, "url": url, "body": body}, allow_nan=True
            ),
            st.sampled_from(["a", "b", "c", "", 5]),
            BODIES,
            st.sampled_from(["POST", "GET"]),
            st.sampled_from(["/v1/chat/completions", "/v1/embeddings"]),
        ),
        st.sampled_from(["", "{", "[1]", '{"custom_id": "z", "url": 1}']),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(LINES)
def test_files_of_random_lines_are_decided_alike_with_and_without_the_fast_path(lines: list[str]) -> None:
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert _run(data, True, monkeypatch) == _run(data, False, monkeypatch)
