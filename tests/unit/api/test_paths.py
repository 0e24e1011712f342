"""TokenHub storage paths (`batchinfer.data.locations`) and bearer tokens: the pure parts of the API."""

from __future__ import annotations

from typing import Any

import pytest

from batchinfer.api.errors import documented
from batchinfer.data.accounts import authenticate, hash_key, new_secret
from batchinfer.data.items import Account
from batchinfer.data.locations import InvalidPath, Location, located, parse
from batchinfer.wire.bearer import bearer_token, well_formed


@pytest.mark.parametrize(
    "uri, scheme, prefix, expected",
    [
        ("s3://bucket-1/in/batch.jsonl", "s3", False, Location("s3", "bucket-1", "in/batch.jsonl")),
        ("s3://my.dotted.bucket/a b/c.jsonl", "s3", False, Location("s3", "my.dotted.bucket", "a b/c.jsonl")),
        ("s3://bucket-1/results", "s3", True, Location("s3", "bucket-1", "results/")),
        ("s3://bucket-1/results/", "s3", True, Location("s3", "bucket-1", "results/")),
        ("s3://bucket-1", "s3", True, Location("s3", "bucket-1", "")),
        ("s3://bucket-1/" + "k" * 980, "s3", True, Location("s3", "bucket-1", "k" * 980 + "/")),
        ("s3://bucket-1/a..b/c.jsonl", "s3", False, Location("s3", "bucket-1", "a..b/c.jsonl")),
        (
            "cos://data-1250000000.ap-guangzhou/in.jsonl",
            "cos",
            False,
            Location("cos", "data-1250000000", "in.jsonl", "ap-guangzhou"),
        ),
        (
            "cos://data-1250000000.ap-guangzhou/out",
            "cos",
            True,
            Location("cos", "data-1250000000", "out/", "ap-guangzhou"),
        ),
    ],
)
def test_valid_paths(uri: str, scheme: str, prefix: bool, expected: Location) -> None:
    assert parse(uri, scheme, prefix=prefix) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "uri, scheme, prefix, message",
    [
        (
            "s3:/bucket/key",
            "s3",
            False,
            "expected a s3:// path such as 's3://bucket/key', got 's3:/bucket/key'",
        ),
        (
            "cos://b.r/key",
            "s3",
            False,
            "expected a s3:// path such as 's3://bucket/key', got 'cos://b.r/key'",
        ),
        ("s3://Bucket/key", "s3", False, "'Bucket' is not a valid bucket name"),
        ("s3://a..b/key", "s3", False, "'a..b' is not a valid bucket name"),
        ("s3://ab/key", "s3", False, "'ab' is not a valid bucket name"),
        ("s3://bucket/", "s3", False, "'s3://bucket/' names no object (the key is empty or ends with '/')"),
        (
            "s3://bucket/dir/",
            "s3",
            False,
            "'s3://bucket/dir/' names no object (the key is empty or ends with '/')",
        ),
        (
            "cos://data-1250000000/in.jsonl",
            "cos",
            False,
            "cos:// paths name the bucket and its region, 'cos://bucket.region/key'; got host "
            "'data-1250000000'",
        ),
        (
            "cos://data.1250000000.ap/in.jsonl",
            "cos",
            False,
            "cos:// paths name the bucket and its region, 'cos://bucket.region/key'; got host "
            "'data.1250000000.ap'",
        ),
        ("s3://bucket/" + "k" * 1025, "s3", False, "the key is longer than 1024 bytes"),
        # `<prefix><batch id>/output.jsonl` must fit in 1024 bytes: 43 are the batch's
        ("s3://bucket/" + "k" * 981, "s3", True, "the key is longer than 981 bytes (an output prefix)"),
        ("s3://bucket/a/../b.jsonl", "s3", False, "the key has a '.' or '..' segment"),
        ("s3://bucket/../other", "s3", True, "the key has a '.' or '..' segment"),
        ("cos://data-1250000000.ap-guangzhou/a/./b.jsonl", "cos", False, "the key has a '.' or '..' segment"),
    ],
)
def test_invalid_paths_say_why(uri: str, scheme: str, prefix: bool, message: str) -> None:
    with pytest.raises(InvalidPath) as error:
        parse(uri, scheme, prefix=prefix)  # type: ignore[arg-type]
    assert str(error.value) == message


def test_where_uri_and_back() -> None:
    cos = Location("cos", "data-1250000000", "out/x.jsonl", "ap-guangzhou")
    s3 = Location("s3", "bucket-1", "out/x.jsonl")
    assert (cos.where, cos.bucket_ref, cos.uri()) == (
        "cos:ap-guangzhou",
        "cos://data-1250000000",
        "cos://data-1250000000.ap-guangzhou/out/x.jsonl",
    )
    assert (s3.where, s3.bucket_ref, s3.uri("other.jsonl")) == (
        "",
        "s3://bucket-1",
        "s3://bucket-1/other.jsonl",
    )
    assert located(cos.where, cos.bucket, cos.key) == cos
    assert located("", s3.bucket, s3.key) == located(None, s3.bucket, s3.key) == s3


def test_allowlist_keeps_s3_and_cos_apart() -> None:
    account = Account(account_id="a", allowed_buckets=["s3://shared-name"])
    assert account.allows("s3://shared-name")
    assert not account.allows("cos://shared-name")
    assert not account.allows("s3://shared-name-2")


@pytest.mark.parametrize(
    "headers, token",
    [
        ({"Authorization": "Bearer sk-1"}, "sk-1"),
        ({"authorization": "bearer  sk-1 "}, "sk-1"),
        ({"AUTHORIZATION": "Bearer sk-1"}, "sk-1"),
        ({"Authorization": "Basic dXNlcjpw"}, None),
        ({"Authorization": "Bearer"}, None),
        ({"Authorization": ""}, None),
        ({}, None),
    ],
)
def test_bearer_token(headers: dict[str, str], token: str | None) -> None:
    assert bearer_token(headers) == token


class NoReads:
    """A table any use of which fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the table was used: {name}")


@pytest.mark.parametrize("token", ["sk bad", "sk-bi-" + "a" * 300, "sk-bi-\u00e9", "a;b", "sk===", "\x00"])
def test_a_malformed_token_is_refused_before_any_table_read(token: str) -> None:
    assert authenticate(token, table=NoReads()) is None  # type: ignore[arg-type]


def test_well_formed_tokens_are_the_keys_rfc_6750_allows() -> None:
    assert [well_formed(t) for t in (new_secret(), "sk-bi-sample-key-for-sam-local-invoke", "a/b+c==")] == [
        True,
        True,
        True,
    ]


def test_keys_are_random_and_stored_as_sha256() -> None:
    first, second = new_secret(), new_secret()
    assert first != second and first.startswith("sk-bi-") and len(first) == 49
    assert hash_key("sk-test") == "f3abf2a6cc4f00987743db5f544ba345b4899ae31f326d8ee9c4816de153c9e0"  # sha256


def test_documented_responses_list_the_error_envelopes() -> None:
    responses = documented(None, 404, 429)
    assert sorted(responses) == [200, 400, 401, 404, 429, 503]
    assert responses[429]["headers"]["Retry-After"]["schema"] == {"type": "integer"}
    assert responses[503]["headers"]["Retry-After"]["schema"] == {"type": "integer"}
    assert responses[200] == {"description": "Successful Response"}
