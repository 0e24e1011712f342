"""The progress bar's rates: requests/s, tokens/s and the ETA from polled Batch objects."""

from __future__ import annotations

from batchinfer_local.cli.progress import Rates


def _batch(status: str, done: int, failed: int = 0, tokens: int = 0, total: int = 20) -> dict:
    return {
        "status": status,
        "request_counts": {"total": total, "completed": done, "failed": failed},
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": tokens},
    }


def test_rates_start_at_in_progress_and_give_requests_tokens_and_eta() -> None:
    rates = Rates()
    assert rates.update(_batch("validating", 0), now=100.0) == {"rps": "-", "tps": "-", "eta": "-"}
    assert rates.update(_batch("in_progress", 0), now=102.0) == {"rps": "-", "tps": "-", "eta": "-"}
    assert rates.update(_batch("in_progress", 0), now=103.0) == {"rps": "-", "tps": "-", "eta": "-"}
    # 8 requests (1 failed) and 400 tokens in 4 s since in_progress: 2 req/s, 100 tok/s, 12 left: 6 s
    assert rates.update(_batch("in_progress", 7, 1, 400), now=106.0) == {
        "rps": "2.0",
        "tps": "100.0",
        "eta": "0:06",
    }
    # ETA in minutes past 60 s
    assert rates.update(_batch("in_progress", 9, 1, 500, total=1000), now=112.0) == {
        "rps": "1.0",
        "tps": "50.0",
        "eta": "16:30",
    }


def test_rates_sum_input_and_output_tokens_when_total_is_absent() -> None:
    batch = {"status": "in_progress", "request_counts": {"total": 4, "completed": 2, "failed": 0}}
    rates = Rates()
    rates.update({**batch, "request_counts": {"total": 4, "completed": 0, "failed": 0}}, now=0.0)
    assert rates.update({**batch, "usage": {"input_tokens": 30, "output_tokens": 10}}, now=2.0) == {
        "rps": "1.0",
        "tps": "20.0",
        "eta": "0:02",
    }


def test_the_cached_input_tokens_are_read_from_the_batch_usage() -> None:
    usage = {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 675}}
    assert Rates.cached({"usage": usage}) == 675
    assert Rates.cached({"usage": {"input_tokens": 10}}) == 0
    assert Rates.cached({}) == 0
