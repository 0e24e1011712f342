"""A shard file's requests."""

from batchinfer.pipeline.shard.requests import Request, parse_shard


def test_parse_shard_keeps_line_numbers_and_u2028() -> None:
    data = b'3\t{"custom_id":"a","body":{"x":"one\xe2\x80\xa8two"}}\n7\t{"custom_id":"b","body":{}}\n'
    assert parse_shard(data) == [Request(3, "a", {"x": "one\u2028two"}), Request(7, "b", {})]
