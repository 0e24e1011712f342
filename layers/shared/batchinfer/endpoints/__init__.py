"""The batch endpoints: one module each, one registry.

- `base`: the `Endpoint` contract (url template and pattern, request body model and its checks, the
  model a line names, how a backend serves it, the result body model, usage counting).
- `chat`: `/v1/chat/completions`.
- `infer`: `/v2/models/{model}/infer` (KServe v2 token requests).
- `registry`: `ENDPOINTS`, url matching, `register`.

Imports `batchinfer.core`, `wire`, `backends` and `infer` (what serves an endpoint); `validation`
and `pipeline` import it.
"""
