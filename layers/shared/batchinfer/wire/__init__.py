"""Wire shapes: the OpenAI Batch/Files objects, the batch status machine, the KServe v2 token contract,
strict JSON. Imports only `batchinfer.core`."""
