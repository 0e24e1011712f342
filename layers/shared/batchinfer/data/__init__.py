"""Data access: DynamoDB items, S3 objects, SQS messages, user storage paths.

The batch table: `keys` (its one description and every key), `items` (the typed items), `table`
(conditional writes, transactions, paging), one module per item kind (`batches`, `shards`, `files`,
`uploads`, `accounts`). Then `s3`, `sqs` and `locations`. Imports `batchinfer.core` and `batchinfer.wire`."""
