"""Data access: DynamoDB items, S3 objects, SQS messages, user storage paths.

Imports `batchinfer.core` and `batchinfer.wire`."""
