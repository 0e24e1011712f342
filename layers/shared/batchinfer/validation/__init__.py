"""Validation of batch input files: line splitting and per-line checks.

Imports `batchinfer.core` and `batchinfer.wire`."""
