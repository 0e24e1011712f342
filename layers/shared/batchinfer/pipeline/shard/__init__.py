"""The shard worker: run a shard's requests on the model backend and commit them exactly once.

A shard message may arrive twice (SQS is at-least-once), concurrently or after the shard is done.
One message at a time holds the shard's lease (`shards.claim`), renewed while it works
(`LeaseHeartbeat`); results go to a key of that write's own with one PUT; `shards.commit` counts
them and names the key in one transaction guarded by the shard's owner and `next_index`, so repeated
work never counts twice and only the committed key is ever read (a worker paused past its lease must
not overwrite, nor count, what the shard's new holder wrote).
Near the Lambda time limit the worker stops launching requests, commits what finished and enqueues a
continuation for the rest.

Modules, in the order a request goes through them:
- `requests`: a shard's requests (`parse_shard`) and what each ended in (`Outcome`);
- `retry`: the retry policy and `call_backend`, the one place a request is retried;
- `limits`: the per-process concurrency limiter and latency of each backend, and the wrappers
  that make one request wait for a permit (`Limited`) and time its answer (`Timed`);
- `window`: one window of a shard's requests run concurrently (`WindowRun` -> `Window`);
- `progress`: the live link to the batch while a window runs, and how an ending batch ends;
- `parts`: result lines (`render`), written to S3 as a part, recovered after a crash;
- `worker`: the shard flow (`process_shard`): slot, claim, windows, commits, continuation.
"""
