"""Token inference: `POST /v2/models/{model}/infer` in the KServe v2 shape of MindIE's token interface.

- `service`: serving a request on a registry model's token backend (HTTP function and batch worker).
- `app`: the Powertools resolver of the `/v2` routes (the TokenInferFunction).
- `gguf_tokenizer`: derive `tokenizer.json` / `tokenizer_config.json` from a GGUF file, for the
  KServe v2 backend's chat requests (a tool; needs the `gguf` package).

The request/response contract itself is `batchinfer.wire.kserve`.
"""
