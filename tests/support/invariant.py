"""The one invariant every batch that ran must satisfy (tests/fixtures/cases/README.md conventions).

Every non-blank input line appears exactly once across output.jsonl and error.jsonl (by
`custom_id`), no `custom_id` repeats, `request_counts.total == completed + failed == lines`, the
status is terminal and the timestamps never go backwards.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

TERMINAL = {"completed", "failed", "expired", "cancelled"}
# The order in which a batch's timestamps may be stamped (a status never comes back).
_ORDER = [
    "created_at",
    "in_progress_at",
    "cancelling_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelled_at",
]


def input_ids(text: str | bytes) -> list[str]:
    """custom_ids of the non-blank lines of a batch input."""
    raw = text.decode("utf-8-sig") if isinstance(text, bytes) else text
    return [json.loads(line)["custom_id"] for line in raw.split("\n") if line.strip()]


def result_ids(data: bytes | None) -> list[str]:
    return [json.loads(line)["custom_id"] for line in (data or b"").splitlines() if line.strip()]


def assert_batch_invariant(
    batch: dict[str, Any], input_text: str | bytes, output: bytes | None, errors: bytes | None
) -> None:
    """Raise AssertionError naming the first broken part of the invariant."""
    expected = input_ids(input_text)
    out, err = result_ids(output), result_ids(errors)
    assert batch["status"] in TERMINAL, f"status {batch['status']} is not terminal"
    repeated = [cid for cid, n in Counter(out + err).items() if n > 1]
    assert not repeated, f"custom_ids in more than one result line: {repeated[:5]}"
    assert Counter(out + err) == Counter(expected), (
        f"lost {sorted(set(expected) - set(out + err))[:5]}, extra "
        f"{sorted(set(out + err) - set(expected))[:5]}"
    )
    counts = batch["request_counts"]
    assert counts == {"total": len(expected), "completed": len(out), "failed": len(err)}, counts
    stamped = [(name, batch[name]) for name in _ORDER if batch.get(name) is not None]
    times = [t for _, t in stamped]
    assert times == sorted(times), f"timestamps go backwards: {stamped}"
