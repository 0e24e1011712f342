"""The HTTP API (OpenAI Batch and Files APIs) on the Powertools event handler."""
