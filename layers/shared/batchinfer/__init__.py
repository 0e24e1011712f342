"""batchinfer: the domain of a serverless batch LLM inference service (shared Lambda layer)."""
