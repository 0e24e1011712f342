"""The answer of a batch's dry run (`POST /v1/batches` with `"dry_run": true`): the input file checked
as prepare would, its tokens counted and its cost estimated; no batch is created."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from batchinfer.wire.openai import BatchErrors


class DryRunCounts(BaseModel):
    """Requests of the file: `total` non-blank lines, `valid` of them with no problem."""

    total: int = 0
    valid: int = 0


class DryRunUsage(BaseModel):
    """Tokens of the valid requests: `input_tokens` counted (`input_tokens_method`: `tokenizer`, the
    model's own; `estimate`, one per 4 bytes of text), `output_tokens` at most what the lines allow
    (each line's max_completion_tokens / max_tokens / max_output_tokens, else the model's default)."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_tokens_method: Literal["tokenizer", "estimate"] = "estimate"


class EstimatedCost(BaseModel):
    """The usage priced with the model's price table (`price` in the model registry), rounded to
    billionths of `currency`; `output` (so `total`) is an upper bound, as the output tokens are."""

    currency: str
    input: float
    output: float
    total: float


class DryRun(BaseModel):
    """A batch's dry run. `valid`: the batch would start (prepare would accept every line); `errors`:
    every problem found (as the failed batch's `errors` would list them); `usage` and
    `estimated_cost` (null: the model has no price) cover the valid requests."""

    object: Literal["batch.dry_run"] = "batch.dry_run"
    input_file_id: str
    endpoint: str
    completion_window: str
    model: str | None = None
    valid: bool
    errors: BatchErrors = Field(default_factory=BatchErrors)
    error_count: int = Field(0, description="every problem found; `errors` lists the first of them")
    request_counts: DryRunCounts = Field(default_factory=DryRunCounts)
    usage: DryRunUsage = Field(default_factory=DryRunUsage)
    estimated_cost: EstimatedCost | None = None
