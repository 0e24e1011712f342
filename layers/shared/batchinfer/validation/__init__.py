"""Validation of batch input files, as `prepare` streams them.

- `jsonl`: splitting a byte stream into numbered physical lines.
- `file`: `FileValidator`, the per-line checks and file limits, and the `RequestLine`s it yields.
- `errors`: `ErrorCode` and `LineError`, what a failed batch reports in `errors.data[]`.
- `endpoints`: the batch endpoints, url matching, and each endpoint's body checks.
- `seen_ids`: `SeenIds`, exact duplicate detection of `custom_id`s in bounded memory.

Imports `batchinfer.core` and `batchinfer.wire`."""
