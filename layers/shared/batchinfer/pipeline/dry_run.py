"""A batch's dry run: its input file validated as prepare validates it, its input tokens counted with
the model's tokenizer (`backends.token_count`), its output tokens bounded by each line's cap, and its
cost estimated from the model's price (`price` in the model registry). Nothing is written, queued or
counted against the account: it only reads the file.
"""

from __future__ import annotations

from typing import Any

from batchinfer.backends import load_registry
from batchinfer.backends.config import Price
from batchinfer.backends.token_count import Estimate, TokenCounter, counter_for
from batchinfer.core.observability import logger
from batchinfer.core.settings import get_settings
from batchinfer.data import s3
from batchinfer.data.locations import Location
from batchinfer.pipeline.prepare import file_validator
from batchinfer.validation.file import RequestLine
from batchinfer.validation.jsonl import iter_physical_lines
from batchinfer.wire.dry_run import DryRun, DryRunCounts, DryRunUsage, EstimatedCost
from batchinfer.wire.openai import EMBEDDINGS_ENDPOINT, BatchErrors, LineErrorOut

# A model's completion cap when its backend has no `default_max_tokens` (OpenAI-compatible servers
# choose their own): llama.cpp's and the KServe backend's default.
FALLBACK_MAX_TOKENS = 256
# The body fields that cap a line's output, first found wins (chat, completions, responses).
_OUTPUT_CAPS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def output_cap(url: str, body: dict[str, Any], default: int) -> int:
    """The most output tokens a line may produce: its own cap, else the model's `default` (embeddings:
    none)."""
    if url == EMBEDDINGS_ENDPOINT:
        return 0
    for name in _OUTPUT_CAPS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def priced(usage: DryRunUsage, price: Price | None) -> EstimatedCost | None:
    """`usage` at `price` (None: no price set), rounded to billionths."""
    if price is None:
        return None
    cost_in = usage.input_tokens * price.input_per_million / 1_000_000
    cost_out = usage.output_tokens * price.output_per_million / 1_000_000
    return EstimatedCost(
        currency=price.currency,
        input=round(cost_in, 9),
        output=round(cost_out, 9),
        total=round(cost_in + cost_out, 9),
    )


class _Tally:
    """The token totals of the valid lines, the model's counter made at its first line."""

    def __init__(self) -> None:
        self.registry = load_registry(get_settings().model_registry)
        self.counter: TokenCounter | None = None
        self.default_max = FALLBACK_MAX_TOKENS
        self.input_tokens = self.output_tokens = self.valid = 0

    def add(self, request: RequestLine) -> None:
        if self.counter is None:
            config = self.registry.config(request.model)
            self.counter = counter_for(config)
            self.default_max = getattr(config, "default_max_tokens", FALLBACK_MAX_TOKENS)
        try:
            self.input_tokens += self.counter.count(request.url, request.body)
        except Exception:  # the run would answer this line with an error: its text, estimated
            logger.info("dry run: a line the tokenizer refused is estimated", extra={"line": request.line})
            self.input_tokens += Estimate().count(request.url, request.body)
        self.output_tokens += output_cap(request.url, request.body, self.default_max)
        self.valid += 1


def dry_run(source: Location, *, input_file_id: str, endpoint: str, window: str) -> DryRun:
    """Validate the input at `source` (the file `input_file_id`) for a batch of `endpoint` and
    completion window `window`, and estimate its tokens and cost. Raises botocore `ClientError` when
    the input can't be read."""
    settings = get_settings()
    validator, tally = file_validator(endpoint), _Tally()
    chunks = s3.iter_chunks(source.bucket, source.key, where=source.where)
    lines = iter_physical_lines(chunks, settings.max_line_bytes, max_total_bytes=settings.max_file_bytes)
    for line in lines:
        if (request := validator.feed(line)) is not None:
            tally.add(request)
    validator.finish(lines.bytes_read)
    usage = DryRunUsage(
        input_tokens=tally.input_tokens,
        output_tokens=tally.output_tokens,
        total_tokens=tally.input_tokens + tally.output_tokens,
        input_tokens_method=tally.counter.method if tally.counter else "estimate",
    )
    model = validator.model
    price = tally.registry.config(model).price if model in tally.registry else None
    return DryRun(
        input_file_id=input_file_id,
        endpoint=endpoint,
        completion_window=window,
        model=model,
        valid=validator.ok,
        errors=BatchErrors(data=[LineErrorOut.model_validate(e.model_dump()) for e in validator.errors]),
        error_count=validator.error_count,
        request_counts=DryRunCounts(total=validator.request_count, valid=tally.valid),
        usage=usage,
        estimated_cost=priced(usage, price),
    )
