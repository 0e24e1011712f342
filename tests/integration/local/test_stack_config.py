"""The local stack reading templates: the real template.yaml resolved against moto, and the
configuration errors it must report clearly (leaving nothing running and the environment as it was).
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from batchinfer_local import LocalStack, TemplateError
from batchinfer_local.functions import function_specs, merged_environment
from batchinfer_local.resources import create_resources
from batchinfer_local.template import Resolver, load_template
from batchinfer_local.template_stack import TemplateStack

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, object]]:
    """In-process moto with boto3 clients (no endpoint override, dummy credentials)."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        yield {name: boto3.client(name, region_name="us-east-1") for name in ("sqs", "dynamodb", "s3")}


def test_real_template_resolves_to_local_resources_and_environment(aws: dict[str, object]) -> None:
    template = load_template(REPO / "template.yaml")
    resolver = Resolver(template, {"ShardSize": "10"})
    resolver.add_resource("HttpApi", "HttpApi")
    made = create_resources(template, resolver, aws)
    specs = {spec.logical_id: spec for spec in function_specs(template, REPO, resolver)}

    assert made.tables == {"BatchTable": "batchinfer-local-BatchTable"}
    assert made.buckets == {"DataBucket": "batchinfer-123456789012-us-east-1-data"}
    assert made.redrive == {
        "UploadsQueue": ("UploadsDeadLetterQueue", 5),
        "PrepareQueue": ("PrepareDeadLetterQueue", 5),
        "ShardsQueue": ("ShardsDeadLetterQueue", 5),
        "FinalizeQueue": ("FinalizeDeadLetterQueue", 5),
        "WebhookQueue": ("WebhookDeadLetterQueue", 5),
    }
    assert made.notification_queues == {"UploadsQueue"}
    environment = merged_environment(list(specs.values()))
    assert environment == {
        "POWERTOOLS_SERVICE_NAME": "batchinfer",
        "POWERTOOLS_METRICS_NAMESPACE": "batchinfer",
        "POWERTOOLS_LOG_LEVEL": "INFO",
        "TABLE_NAME": "batchinfer-local-BatchTable",
        "BUCKET_NAME": "batchinfer-123456789012-us-east-1-data",
        "PREPARE_QUEUE_URL": made.queue_urls["PrepareQueue"],
        "SHARDS_QUEUE_URL": made.queue_urls["ShardsQueue"],
        "FINALIZE_QUEUE_URL": made.queue_urls["FinalizeQueue"],
        "WEBHOOK_QUEUE_URL": made.queue_urls["WebhookQueue"],
        "SHARD_SIZE": "10",  # the override
        "REMOTE_SHARD_SIZE": "5000",
        "WORKER_CONCURRENCY": "512",  # the default, as the string CloudFormation passes
        "MAX_SHARD_WORKERS": "20",
        "ACCOUNT_SHARD_SHARE": "0.8",
        "EXPECTED_BUCKET_OWNER": "123456789012",
        "COS_ENDPOINT_URL": "",
        "COS_CREDENTIALS_SECRET": "batchinfer/cos",
        "MAX_ACTIVE_BATCHES": "10",  # ApiFunction's own variables
        "MAX_CREATES_PER_MINUTE": "20",
        "MAX_INFER_IN_FLIGHT": "4",  # TokenInferFunction's own
    }
    assert made.queue_urls["PrepareQueue"].endswith("/123456789012/batchinfer-local-PrepareQueue")
    assert {lid: (s.timeout, s.memory_size) for lid, s in specs.items()} == {
        "ApiFunction": (29, 512),
        "UploadTriggerFunction": (60, 512),
        "PrepareFunction": (900, 1024),
        "ShardWorkerFunction": (900, 3008),
        "AggregatorFunction": (900, 1024),
        "SweeperFunction": (300, 512),
        "TokenInferFunction": (29, 3008),
        "StatusEventsFunction": (30, 256),
        "WebhookFunction": (30, 256),
    }
    (stream,) = specs["StatusEventsFunction"].events
    assert (stream.type, stream.starting_position, stream.batch_size, stream.maximum_batching_window) == (
        "DynamoDB",
        "TRIM_HORIZON",
        100,
        1,
    )
    assert stream.stream_arn == made_table_stream(aws)
    assert specs["ShardWorkerFunction"].handler_file == REPO / "functions" / "shard_worker" / "app.py"
    assert specs["ApiFunction"].handler_file == REPO / "functions" / "api" / "app.py"
    assert {s.handler_name for s in specs.values()} == {"lambda_handler"}
    assert [e.route_key for e in specs["ApiFunction"].events] == [
        "ANY /v1/{proxy+}",
        "GET /console",
        "GET /console/",
        "GET /console/{proxy+}",
    ]

    sqs, dynamodb, s3 = aws["sqs"], aws["dynamodb"], aws["s3"]
    attributes = sqs.get_queue_attributes(QueueUrl=made.queue_urls["ShardsQueue"], AttributeNames=["All"])[
        "Attributes"
    ]  # type: ignore[attr-defined]
    assert attributes["VisibilityTimeout"] == "5400"
    assert json.loads(attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": "arn:aws:sqs:us-east-1:123456789012:batchinfer-local-ShardsDeadLetterQueue",
        "maxReceiveCount": 5,
    }
    table = dynamodb.describe_table(TableName="batchinfer-local-BatchTable")["Table"]  # type: ignore[attr-defined]
    assert [(i["IndexName"], i["Projection"]) for i in table["GlobalSecondaryIndexes"]] == [
        ("GSI1", {"ProjectionType": "ALL"}),
        ("OpenBatches", {"ProjectionType": "KEYS_ONLY"}),  # the sweeper's sparse index of open batches
    ]
    assert dynamodb.describe_time_to_live(TableName="batchinfer-local-BatchTable")[
        "TimeToLiveDescription"
    ] == {  # type: ignore[attr-defined]
        "TimeToLiveStatus": "ENABLED",
        "AttributeName": "ttl",
    }
    notification = s3.get_bucket_notification_configuration(Bucket="batchinfer-123456789012-us-east-1-data")  # type: ignore[attr-defined]
    [queue] = notification["QueueConfigurations"]
    assert queue["QueueArn"] == "arn:aws:sqs:us-east-1:123456789012:batchinfer-local-UploadsQueue"
    assert queue["Events"] == ["s3:ObjectCreated:*"]
    assert sorted((r["Name"].lower(), r["Value"]) for r in queue["Filter"]["Key"]["FilterRules"]) == [
        ("prefix", "inbox/"),
        ("suffix", ".jsonl"),
    ]


def made_table_stream(aws: dict[str, object]) -> str:
    """The stream ARN of the batch table as created (NEW_AND_OLD_IMAGES)."""
    table = aws["dynamodb"].describe_table(TableName="batchinfer-local-BatchTable")["Table"]  # type: ignore[attr-defined]
    assert table["StreamSpecification"] == {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}
    return table["LatestStreamArn"]


HANDLER = """\
import os

def handler(event, context):
    return {"statusCode": 200, "body": os.environ["FOO"]}
"""


def write_stack(tmp_path: Path, body: str, handler: str | None = HANDLER) -> Path:
    """A template in tmp_path (its functions' code in tmp_path/fn) and its path."""
    (tmp_path / "fn").mkdir()
    if handler is not None:
        (tmp_path / "fn" / "app.py").write_text(handler)
    path = tmp_path / "template.yaml"
    path.write_text("Transform: AWS::Serverless-2016-10-31\n" + textwrap.dedent(body))
    return path


ONE_FUNCTION = """
Resources:
  Fn:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: fn
      Handler: app.handler
      Runtime: python3.12
      Environment:
        Variables:
          FOO: bar
      Events:
        Get:
          Type: HttpApi
          Properties:
            Method: GET
            Path: /foo
"""


def test_environment_is_set_while_running_and_restored_after(tmp_path: Path) -> None:
    before = dict(os.environ)
    with LocalStack(write_stack(tmp_path, ONE_FUNCTION), port=0) as stack:
        assert os.environ["FOO"] == "bar"
        assert os.environ["AWS_ENDPOINT_URL"] == stack.moto_endpoint
        assert (os.environ["AWS_REGION"], os.environ["AWS_DEFAULT_REGION"]) == ("us-east-1", "us-east-1")
        response = httpx.get(f"{stack.base_url}/foo", timeout=30)
        assert (response.status_code, response.text) == (200, "bar")
        assert stack.invocations("Fn") == 1
    assert dict(os.environ) == before


def test_start_hooks_run_once_the_resources_and_variables_exist(tmp_path: Path) -> None:
    # Given a hook that records what it finds and makes a bucket
    seen: list[tuple[str, list[str]]] = []

    def hook(stack: TemplateStack) -> None:
        seen.append((stack.environment["FOO"], sorted(stack.functions)))
        stack.s3.create_bucket(Bucket="made-by-hook")

    # When the engine starts with it
    with TemplateStack(write_stack(tmp_path, ONE_FUNCTION), port=0, start_hooks=[hook]) as stack:
        buckets = {bucket["Name"] for bucket in stack.s3.list_buckets()["Buckets"]}
        answer = httpx.get(f"{stack.base_url}/foo", timeout=30).text

    # Then it ran once, saw the functions and their variables, and what it made is there; the engine
    # itself stores no API key
    assert seen == [("bar", ["Fn"])]
    assert ("made-by-hook" in buckets, answer) == (True, "bar")
    assert not hasattr(stack, "api_key")


def test_local_stacks_own_hooks_run_first_and_a_template_without_a_table_has_no_key(tmp_path: Path) -> None:
    order: list[str] = []
    with LocalStack(
        write_stack(tmp_path, ONE_FUNCTION), port=0, start_hooks=[lambda _: order.append("mine")]
    ) as stack:
        order.append("started")
        assert stack.api_key is None
    assert order == ["mine", "started"]


def test_only_one_stack_per_process(tmp_path: Path) -> None:
    with LocalStack(write_stack(tmp_path, ONE_FUNCTION), port=0) as stack:
        with pytest.raises(RuntimeError, match="already running in this process"):
            LocalStack(tmp_path / "template.yaml", port=0).start()
        assert httpx.get(f"{stack.base_url}/foo", timeout=30).text == "bar"


def assert_start_fails(path: Path, message: str) -> None:
    before = dict(os.environ)
    with pytest.raises(TemplateError) as error:
        LocalStack(path, port=0).start()
    assert str(error.value) == message
    assert dict(os.environ) == before


def test_each_function_sees_its_own_variables(tmp_path: Path) -> None:
    path = write_stack(
        tmp_path,
        """
        Resources:
          One:
            Type: AWS::Serverless::Function
            Properties:
              CodeUri: fn
              Handler: app.handler
              Environment: {Variables: {FOO: a}}
              Events: {Get: {Type: HttpApi, Properties: {Method: GET, Path: /one}}}
          Two:
            Type: AWS::Serverless::Function
            Properties:
              CodeUri: fn
              Handler: app.handler
              Environment: {Variables: {FOO: b}}
              Events: {Get: {Type: HttpApi, Properties: {Method: GET, Path: /two}}}
        """,
    )
    with LocalStack(path, port=0) as stack:
        answers = [httpx.get(f"{stack.base_url}/{name}", timeout=30).text for name in ("one", "two")]
        assert "FOO" not in stack.environment  # the variables the functions share: not this one
        assert stack.function_environment_of("One")["FOO"] == "a"
    assert answers == ["a", "b"]


def test_missing_handler_file_is_reported(tmp_path: Path) -> None:
    path = write_stack(tmp_path, ONE_FUNCTION, handler=None)
    assert_start_fails(path, f"Fn: handler file {tmp_path.resolve() / 'fn' / 'app.py'} does not exist")


def test_unresolvable_reference_is_reported(tmp_path: Path) -> None:
    path = write_stack(
        tmp_path,
        """
        Resources:
          Fn:
            Type: AWS::Serverless::Function
            Properties:
              CodeUri: fn
              Handler: app.handler
              Environment: {Variables: {FOO: !GetAtt Nowhere.Arn}}
        """,
    )
    assert_start_fails(
        path, "Fn.Environment.FOO.Fn::GetAtt: resource Nowhere (not declared) has no local value"
    )


def test_unsupported_event_type_is_reported(tmp_path: Path) -> None:
    path = write_stack(
        tmp_path,
        """
        Resources:
          Fn:
            Type: AWS::Serverless::Function
            Properties:
              CodeUri: fn
              Handler: app.handler
              Events:
                Stream: {Type: Kinesis, Properties: {Stream: arn, StartingPosition: LATEST}}
        """,
    )
    assert_start_fails(path, "Fn.Stream: event type Kinesis is not emulated locally")


def test_iam_enforcement_can_be_turned_off_keeping_the_identities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHINFER_LOCAL_IAM", "off")
    with LocalStack(write_stack(tmp_path, ONE_FUNCTION), port=0) as stack:
        table_access = stack.function_client("Fn", "dynamodb").list_tables()  # no policy grants it
        identity = stack.function_client("Fn", "sts").get_caller_identity()["Arn"]
    assert stack.iam_enforced is False
    assert table_access["TableNames"] == []
    assert identity == "arn:aws:sts::123456789012:assumed-role/batchinfer-local-FnRole/batchinfer-local-Fn"
    with (
        LocalStack(tmp_path / "template.yaml", port=0, iam=True) as stack,
        pytest.raises(ClientError) as denied,
    ):
        stack.function_client("Fn", "dynamodb").list_tables()
    assert denied.value.response["Error"]["Code"] == "AccessDeniedException"
