"""The batch pipeline: intake, prepare, shard worker, aggregator, sweeper, inbox uploads.

The top layer with `api` and `infer`: it may import every layer below."""
