"""Validation of batch input files, as `prepare` streams them.

- `jsonl`: splitting a byte stream into numbered physical lines.
- `file`: `FileValidator`, the per-line checks and file limits, and the `RequestLine`s it yields.
- `envelope`: the request envelope of a line and its errors.
- `sniff`: what an input file is when it is not JSON Lines at all, and why a line is not JSON.
- `seen_ids`: `SeenIds`, exact duplicate detection of `custom_id`s in bounded memory.

What a line's url and body must be is its endpoint's (`batchinfer.endpoints`); the errors are
`batchinfer.wire.line_errors`. Imports `batchinfer.core`, `wire` and `endpoints`."""
