"""Wire shapes and rules, one home each. Imports only `batchinfer.core`.

- `openai`: the Batch/File/Upload objects, the result lines of output.jsonl/error.jsonl, `MAX_ID_LENGTH`.
- `status`: the batch status machine.
- `chat`: the chat completions request schema (strict for batch lines, a view for the backends) and
  its response (`ChatCompletionResponse`).
- `kserve`: the /v2 token inference contract (KServe v2, MindIE); `tokens`: what a token backend
  takes and gives (limits, sampling parameters, results).
- `line_errors`: `LineError`, what a failed batch reports in `errors.data[]`, and `ErrorCode`.
- `rules`: the words of a pydantic model's field rules, for error messages.
- `strict_json`: the one JSON loader (RFC 8259) and the nesting limit.
- `messages`: how error messages name a place (`messages[0].content`) and show a value.
"""
