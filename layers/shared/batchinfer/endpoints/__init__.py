"""The batch endpoints: one module each, one registry.

- `base`: the `Endpoint` contract (url template and pattern, request body model and its checks, the
  model a line names, how a backend serves it, the result body model, usage counting).
- `chat`: `/v1/chat/completions`.
- `infer`: `/v2/models/{model}/infer` (KServe v2 token requests).
- `completions`: `/v1/completions`; `responses`: `/v1/responses` (text).
- `registry`: `ENDPOINTS`, url matching, `register`.

A layer of its own between `infer` and `validation`: an endpoint says how a backend serves it (the
token endpoint through `batchinfer.infer.service`), and validation checks a line against its
endpoint. Imports `wire` and `infer`; `validation` and `pipeline` import it.
"""
