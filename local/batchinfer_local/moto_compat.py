"""Where moto's output differs from AWS's in a way handlers would notice, bring it in line.

moto 5.2.5's S3 event notifications (moto/s3/notifications.py `_get_s3_event`):
- leave out fields that S3 always sends (record `userIdentity`, `requestParameters`,
  `responseElements`, bucket `ownerIdentity`, object `sequencer`; see
  https://docs.aws.amazon.com/AmazonS3/latest/userguide/notification-content-structure.html),
  so a handler parsing them with a strict model (e.g. Powertools' `S3Model`) would fail only locally;
- encode the object key with `quote_plus(key)`, slashes included (`inbox%2Fa.jsonl`), where S3
  form-encodes it but leaves `/` as is (`inbox/my+file.jsonl`; reported in
  https://github.com/minio/minio/issues/11665), so a prefix check on the raw key behaves
  differently locally. Handlers must `unquote_plus` keys either way.

moto 5.2.5's DynamoDB Streams (moto/dynamodbstreams/models.py) keep every shard iterator they hand
out and every record of the table's stream, forever, each with its old and new item: a poller asking
GetRecords four times a second, and a stack writing batch headers several times a second, grow the
process by gigabytes in a long test run. AWS expires an iterator after 15 minutes and a record after
24 hours; `trim_read_stream_records` drops each iterator once it has been read (the local stream
source never reads one twice) and the records every reader has read (the ones before the oldest
outstanding iterator's position). An iterator nobody used for `ITERATOR_TTL_S` expires (AWS: 15
minutes; shorter here, since a local reader asks four times a second): a reader that gave one up after
a failed poll (it starts again after its last delivered record) no longer keeps every later record.

moto 5.2.5's SQS ReceiveMessage (moto/sqs/models.py `SQSBackend.receive_message`) hands out the
visible messages of a queue in the order they were sent and looks at `MessageGroupId` only on FIFO
queues. On AWS, a standard queue whose messages carry a `MessageGroupId` is a fair queue: once a
tenant (message group) takes a disproportionate share of the messages in flight or of the consumers'
time, the messages of the quiet tenants are received first, so one tenant's backlog does not raise
the others' dwell time. Sources:
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-fair-queues.html and
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-fair-queues-detailed.html.
Locally the shards queue would keep one account's 50 queued shards ahead of another's 2.
`deliver_fairly` orders a standard queue's visible messages the way a fair queue prefers them: the
groups with the fewest messages in flight first, then the oldest message. AWS prefers the quiet
tenants only once it has found a noisy one (approximately: over 10% of the messages in flight and 30
of its own, or over 10% of the consumers' recent processing time); the local rule prefers them at
once, since the local stack's few consumers never put 30 messages in flight. A message without a
group is a tenant of its own (AWS's rule). Only the order changes:
moto's visibility timeout, receive counts and redrive to the DLQ are untouched.

moto 5.2.5's GetQueueAttributes computes ApproximateNumberOfMessages, ...Delayed and ...NotVisible
one after the other, each from the clock at that instant: a message whose delay or visibility
timeout ends between two of them is counted in none, so three zeros do not mean an empty queue
(seen: `LocalStack.wait_idle` returning while a failed batch waited to be delivered again, about one
time in 20 under load). `messages_held` counts a queue's messages in one read instead.

moto 5.2.5's DynamoDB Query of a table (no index; moto/dynamodb/models/table.py `Table.query`) sorts
every item of the table, then keeps the partition's: each Query costs the whole table, where
DynamoDB reads only the partition. The local stack runs moto in its own process, so with a few
thousand items (a backlog's batches and shards) the sweeper's shard queries and the shard workers'
slot queries held moto's one CPU core and slowed every request of every function (measured with
py-spy in `benchmarks.backlog`: a third of moto's time in those sorts). `query_one_partition` makes
such a Query read its partition only; results, order and paging are moto's.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import quote_plus, unquote_plus, urlsplit

# moto's default identity (the SenderId moto puts on SQS messages) and a stand-in bucket owner.
LOCAL_PRINCIPAL = "AIDAIT2UOQQY3AUEKVGXU"
LOCAL_OWNER = "A1LOCALSTACKOWNER"


def complete_s3_notification(body: str) -> str:
    """`body` with each S3 event record as S3 sends it: missing fields added, key encoded as S3 does.

    Bodies that are not S3 event notifications (e.g. the `s3:TestEvent`) come back unchanged;
    other values moto sent are kept.
    """
    try:
        event = json.loads(body)
    except ValueError:
        return body
    records = event.get("Records") if isinstance(event, dict) else None
    if not isinstance(records, list) or not all(_is_s3_record(record) for record in records):
        return body
    for record in records:
        record.setdefault("userIdentity", {"principalId": f"AWS:{LOCAL_PRINCIPAL}"})
        record.setdefault("requestParameters", {"sourceIPAddress": "127.0.0.1"})
        record.setdefault(
            "responseElements",
            {
                "x-amz-request-id": os.urandom(8).hex().upper(),
                "x-amz-id-2": base64.b64encode(os.urandom(48)).decode(),
            },
        )
        record["s3"]["bucket"].setdefault("ownerIdentity", {"principalId": LOCAL_OWNER})
        obj = record["s3"].get("object")
        if isinstance(obj, dict):
            obj.setdefault("sequencer", f"{time.time_ns():018X}")
            if isinstance(obj.get("key"), str):
                obj["key"] = quote_plus(unquote_plus(obj["key"]), safe="/")
    return json.dumps(event)


def _is_s3_record(record: Any) -> bool:
    return (
        isinstance(record, dict)
        and record.get("eventSource") == "aws:s3"
        and isinstance(record.get("s3"), dict)
        and isinstance(record["s3"].get("bucket"), dict)
    )


def md5_hex(text: str) -> str:
    """The MD5OfBody SQS reports for a message body."""
    return hashlib.md5(text.encode("utf-8")).hexdigest()


# How long an unused stream shard iterator lives locally (seconds; see the module docstring).
ITERATOR_TTL_S = 60.0


def trim_read_stream_records(enabled: bool = True) -> None:
    """While `enabled`, make moto's GetRecords forget the iterator it was given and the records every
    reader has passed (see the module docstring); `False` restores moto's own GetRecords."""
    from moto.dynamodbstreams.models import DynamoDBStreamsBackend

    original = getattr(DynamoDBStreamsBackend.get_records, "_original", None)
    if not enabled:
        if original is not None:
            DynamoDBStreamsBackend.get_records = original  # type: ignore[method-assign]
        return
    if original is not None:
        return
    original = DynamoDBStreamsBackend.get_records

    def get_records(self: DynamoDBStreamsBackend, iterator_arn: str, limit: int) -> dict[str, Any]:
        from .moto_atomic import ITEM_LOCK

        # A write numbers its stream record from the shard's record count and first number: a trim
        # between the two reads gave two records one number (moto's `assert start >= 0` under load).
        with ITEM_LOCK:
            return _read_and_trim(self, original, iterator_arn, limit)

    get_records._original = original  # type: ignore[attr-defined]
    DynamoDBStreamsBackend.get_records = get_records  # type: ignore[method-assign]


def _read_and_trim(backend: Any, original: Any, iterator_arn: str, limit: int) -> dict[str, Any]:
    """moto's GetRecords, then the iterator forgotten and the records every reader has passed dropped."""
    result = original(backend, iterator_arn, limit)
    shard = backend.shard_iterators.pop(iterator_arn).stream_shard
    at = time.monotonic()
    for arn, iterator in list(backend.shard_iterators.items()):
        seen = iterator.__dict__.setdefault("_batchinfer_seen_at", at)
        if at - seen > ITERATOR_TTL_S:
            del backend.shard_iterators[arn]  # expired: its reader gave it up
    # Each reader holds one outstanding iterator (the one just returned): records before the
    # slowest one's position are read by all. moto numbers records from the first one it keeps.
    positions = [it.sequence_number for it in backend.shard_iterators.values() if it.stream_shard is shard]
    read = min(positions, default=shard.starting_sequence_number) - shard.starting_sequence_number
    if read > 0:
        del shard.items[:read]
        shard.starting_sequence_number += read
    return result


def deliver_fairly(enabled: bool = True) -> None:
    """While `enabled`, make moto's standard queues hand out their visible messages as a fair queue
    does (see the module docstring); `False` restores moto's own order.

    The k-th visible message (0-based, in send order) of group g is ranked by in-flight(g) + k: the
    number of g's messages in flight once the earlier ones were received, so a receive of up to 10
    messages shares them out among the groups; equal ranks go to the older message. FIFO queues keep
    moto's order.
    """
    from moto.sqs.models import Queue

    current = Queue.__dict__["messages"]
    original = getattr(current.fget, "_original", None)
    if not enabled:
        if original is not None:
            Queue.messages = property(original)  # type: ignore[method-assign,assignment]
        return
    if original is not None:
        return
    original = current.fget

    def messages(self: Queue) -> list[Any]:
        visible = original(self)
        if self.fifo_queue or not any(m.group_id is not None for m in visible):
            return visible
        in_flight = Counter(m.group_id for m in list(self.pending_messages) if not m.visible)
        earlier: Counter[str] = Counter()
        ranks = []
        for message in visible:
            if message.group_id is None:
                ranks.append(0)  # a tenant of its own
                continue
            ranks.append(in_flight[message.group_id] + earlier[message.group_id])
            earlier[message.group_id] += 1
        order = sorted(range(len(visible)), key=ranks.__getitem__)  # stable: older first on equal ranks
        return [visible[i] for i in order]

    messages._original = original  # type: ignore[attr-defined]
    Queue.messages = property(messages)  # type: ignore[method-assign,assignment]


def messages_held(queue_url: str, region: str) -> int:
    """How many messages the in-process moto's queue at `queue_url` (`<endpoint>/<account>/<name>`)
    holds, visible, in flight and delayed alike, counted in one read (see the module docstring:
    GetQueueAttributes' three counts can all miss a message)."""
    from moto.sqs.models import sqs_backends

    account, name = urlsplit(queue_url).path.strip("/").split("/")
    return len(sqs_backends[account][region].get_queue(name)._messages)


def describe_messages(queue_url: str, region: str) -> list[str]:
    """One line per message the in-process moto's queue at `queue_url` holds: its state (visible, in
    flight, delayed), receive count and the start of its body; for the message of a stack that stays
    busy."""
    from moto.sqs.models import sqs_backends

    account, name = urlsplit(queue_url).path.strip("/").split("/")
    lines = []
    for message in list(sqs_backends[account][region].get_queue(name)._messages):
        state = "delayed" if message.delayed else "visible" if message.visible else "in flight"
        lines.append(f"{name}: {state}, received {message.approximate_receive_count}x: {message.body[:160]}")
    return lines


_partition = threading.local()


def query_one_partition(enabled: bool = True) -> None:
    """While `enabled`, a Query of a moto table itself (not of an index) reads only its partition (see
    the module docstring); `False` restores moto's own. Index queries are moto's (they read every item,
    as before)."""
    from moto.dynamodb.models.table import Table

    current_query, current_all = Table.query, Table.all_items
    original = getattr(current_query, "_original", None)
    if not enabled:
        if original is not None:
            Table.query, Table.all_items = original, current_all._original  # type: ignore[attr-defined]
        return
    if original is not None:
        return

    def query(self: Table, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        # moto's own call passes index_name as the 8th positional argument (after hash_key, 7th here).
        index_name = kwargs.get("index_name", args[6] if len(args) > 6 else None)
        _partition.key = None if index_name else hash_key
        try:
            return current_query(self, hash_key, *args, **kwargs)
        finally:
            _partition.key = None

    def all_items(self: Table) -> Any:
        key = getattr(_partition, "key", None)
        if key is None:
            return current_all(self)
        found = self.items.get(key)  # not self.items[key]: the defaultdict would add the partition
        if found is None:
            return []
        return sorted(found.values(), key=lambda item: item.range_key) if self.range_key_attr else [found]

    query._original, all_items._original = current_query, current_all  # type: ignore[attr-defined]
    Table.query, Table.all_items = query, all_items  # type: ignore[method-assign]
