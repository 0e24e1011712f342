"""A dry run's output bound and cost (pipeline/dry_run.py)."""

from __future__ import annotations

import pytest

from batchinfer.backends.config import Price
from batchinfer.pipeline.dry_run import output_cap, priced
from batchinfer.wire.dry_run import DryRunUsage, EstimatedCost


@pytest.mark.parametrize(
    ("url", "body", "cap"),
    [
        ("/v1/chat/completions", {"max_completion_tokens": 3, "max_tokens": 9}, 3),
        ("/v1/chat/completions", {"max_tokens": 9}, 9),
        ("/v1/responses", {"max_output_tokens": 7}, 7),
        ("/v1/chat/completions", {}, 256),  # the model's default
        ("/v1/chat/completions", {"max_tokens": True}, 256),  # not a number of tokens
        ("/v1/embeddings", {"input": "x"}, 0),
    ],
)
def test_the_output_cap_is_the_lines_own_else_the_models_default(url: str, body: dict, cap: int) -> None:
    assert output_cap(url, body, 256) == cap


def test_the_cost_is_the_usage_at_the_price_per_million() -> None:
    usage = DryRunUsage(input_tokens=1_500_000, output_tokens=250, total_tokens=1_500_250)
    price = Price(input_per_million=0.5, output_per_million=2.0, currency="EUR")

    assert priced(usage, price) == EstimatedCost(currency="EUR", input=0.75, output=0.0005, total=0.7505)
    assert priced(usage, None) is None
