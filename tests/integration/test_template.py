"""template.yaml: the deployment contract every stage and the local stack rely on.

Rules checked come from the Lambda SQS event source guide
(https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html: visibility timeout at
least 6x the function timeout, a DLQ with maxReceiveCount >= 5) and from the project brief.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batchinfer.core.settings import Settings
from batchinfer_local.functions import handler_location
from batchinfer_local.template import load_template, merge_function_globals

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = REPO / "template.yaml"
TEMPLATE = load_template(TEMPLATE_PATH)
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
FUNCTIONS = sorted(
    logical_id for logical_id, r in RESOURCES.items() if r["Type"] == "AWS::Serverless::Function"
)


def merged(logical_id: str) -> dict[str, Any]:
    return merge_function_globals(TEMPLATE, logical_id)


def sqs_sources() -> list[tuple[str, str, dict[str, Any]]]:
    """(function, queue logical id, event properties) for every SQS event source."""
    found = []
    for function in FUNCTIONS:
        for event in (merged(function).get("Events") or {}).values():
            if event["Type"] == "SQS":
                queue, attribute = event["Properties"]["Queue"]["Fn::GetAtt"]
                assert attribute == "Arn"
                found.append((function, queue, event["Properties"]))
    return found


def test_template_declares_the_pipeline() -> None:
    assert TEMPLATE["Transform"] == "AWS::Serverless-2016-10-31"
    assert {logical_id: r["Type"] for logical_id, r in RESOURCES.items()} == {
        "SharedLayer": "AWS::Serverless::LayerVersion",
        "BatchTable": "AWS::DynamoDB::Table",
        "DataBucket": "AWS::S3::Bucket",
        "DataBucketPolicy": "AWS::S3::BucketPolicy",
        "UploadsDeadLetterQueue": "AWS::SQS::Queue",
        "UploadsQueue": "AWS::SQS::Queue",
        "UploadsQueuePolicy": "AWS::SQS::QueuePolicy",
        "PrepareDeadLetterQueue": "AWS::SQS::Queue",
        "PrepareQueue": "AWS::SQS::Queue",
        "ShardsDeadLetterQueue": "AWS::SQS::Queue",
        "ShardsQueue": "AWS::SQS::Queue",
        "FinalizeDeadLetterQueue": "AWS::SQS::Queue",
        "FinalizeQueue": "AWS::SQS::Queue",
        "WebhookDeadLetterQueue": "AWS::SQS::Queue",
        "WebhookQueue": "AWS::SQS::Queue",
        "StatusEventsDeadLetterQueue": "AWS::SQS::Queue",
        "HttpApi": "AWS::Serverless::HttpApi",
        "ApiFunction": "AWS::Serverless::Function",
        "UploadTriggerFunction": "AWS::Serverless::Function",
        "PrepareFunction": "AWS::Serverless::Function",
        "ShardWorkerFunction": "AWS::Serverless::Function",
        "AggregatorFunction": "AWS::Serverless::Function",
        "SweeperFunction": "AWS::Serverless::Function",
        "TokenInferFunction": "AWS::Serverless::Function",
        "StatusEventsFunction": "AWS::Serverless::Function",
        "WebhookFunction": "AWS::Serverless::Function",
        "UploadsDeadLetterAlarm": "AWS::CloudWatch::Alarm",
        "PrepareDeadLetterAlarm": "AWS::CloudWatch::Alarm",
        "ShardsDeadLetterAlarm": "AWS::CloudWatch::Alarm",
        "FinalizeDeadLetterAlarm": "AWS::CloudWatch::Alarm",
        "WebhookDeadLetterAlarm": "AWS::CloudWatch::Alarm",
        "StatusEventsDeadLetterAlarm": "AWS::CloudWatch::Alarm",
        "BatchesPastWindowAlarm": "AWS::CloudWatch::Alarm",
        "HighErrorRateAlarm": "AWS::CloudWatch::Alarm",
        "Dashboard": "AWS::CloudWatch::Dashboard",
    }
    assert sorted(TEMPLATE["Outputs"]) == ["ApiUrl", "DataBucketName", "TableName"]


def test_globals_environment_names_every_setting() -> None:
    assert TEMPLATE["Globals"]["Function"]["Environment"]["Variables"] == {
        "POWERTOOLS_SERVICE_NAME": "batchinfer",
        "POWERTOOLS_METRICS_NAMESPACE": "batchinfer",
        "POWERTOOLS_LOG_LEVEL": "INFO",
        "TABLE_NAME": {"Ref": "BatchTable"},
        "BUCKET_NAME": {"Fn::Sub": "batchinfer-${AWS::AccountId}-${AWS::Region}-data"},
        "PREPARE_QUEUE_URL": {"Ref": "PrepareQueue"},
        "SHARDS_QUEUE_URL": {"Ref": "ShardsQueue"},
        "FINALIZE_QUEUE_URL": {"Ref": "FinalizeQueue"},
        "WEBHOOK_QUEUE_URL": {"Ref": "WebhookQueue"},
        "SHARD_SIZE": {"Ref": "ShardSize"},
        "REMOTE_SHARD_SIZE": {"Ref": "RemoteShardSize"},
        "WORKER_CONCURRENCY": {"Ref": "WorkerConcurrency"},
        "MAX_SHARD_WORKERS": {"Ref": "MaxShardWorkers"},
        "ACCOUNT_SHARD_SHARE": {"Ref": "AccountShardShare"},
        "EXPECTED_BUCKET_OWNER": {"Ref": "AWS::AccountId"},
        "COS_ENDPOINT_URL": {"Ref": "CosEndpointUrl"},
        "COS_CREDENTIALS_SECRET": {"Ref": "CosCredentialsSecret"},
    }
    assert RESOURCES["DataBucket"]["Properties"]["BucketName"] == {
        "Fn::Sub": "batchinfer-${AWS::AccountId}-${AWS::Region}-data"
    }
    assert (
        TEMPLATE["Parameters"]["ShardSize"]["Default"],
        TEMPLATE["Parameters"]["RemoteShardSize"]["Default"],
        TEMPLATE["Parameters"]["WorkerConcurrency"]["Default"],
        TEMPLATE["Parameters"]["MaxShardWorkers"]["Default"],
        TEMPLATE["Parameters"]["AccountShardShare"]["Default"],
    ) == (500, 5000, 512, 20, 0.8)
    # the settings' defaults are the template's (a function without the variable behaves the same)
    fields = Settings.model_fields
    assert (fields["max_shard_workers"].default, fields["account_shard_share"].default) == (20, 0.8)
    assert (fields["shard_size"].default, fields["remote_shard_size"].default) == (500, 5000)


def test_the_account_limits_reach_every_function_that_creates_batches() -> None:
    # POST /v1/batches and inbox uploads hold an account to the same limits (accounts.batch_limits)
    limits = {
        "MAX_ACTIVE_BATCHES": {"Ref": "MaxActiveBatches"},
        "MAX_CREATES_PER_MINUTE": {"Ref": "MaxCreatesPerMinute"},
    }
    having = {
        function
        for function in FUNCTIONS
        if limits.items() <= merged(function)["Environment"]["Variables"].items()
    }
    assert having == {"ApiFunction", "UploadTriggerFunction"}


@pytest.mark.parametrize("function", FUNCTIONS)
def test_every_function_handler_file_exists(function: str) -> None:
    properties = merged(function)
    path, name = handler_location(REPO, function, properties, RESOURCES[function].get("Metadata") or {})
    assert path.is_file(), f"{function}: {path} is missing"
    tree = ast.parse(path.read_text())
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    defined |= {
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    assert name in defined, f"{function}: {path} defines no {name}"


def test_function_packaging() -> None:
    runtimes = {
        function: (merged(function).get("Runtime"), merged(function).get("PackageType", "Zip"))
        for function in FUNCTIONS
    }
    assert runtimes == {
        "AggregatorFunction": ("python3.12", "Zip"),
        "ApiFunction": ("python3.12", "Zip"),
        "PrepareFunction": ("python3.12", "Zip"),
        "ShardWorkerFunction": (None, "Image"),
        "StatusEventsFunction": ("python3.12", "Zip"),
        "SweeperFunction": ("python3.12", "Zip"),
        "TokenInferFunction": (None, "Image"),
        "UploadTriggerFunction": ("python3.12", "Zip"),
        "WebhookFunction": ("python3.12", "Zip"),
    }
    for function in FUNCTIONS:
        expected = (
            [] if function in ("ShardWorkerFunction", "TokenInferFunction") else [{"Ref": "SharedLayer"}]
        )
        assert merged(function).get("Layers", []) == expected, function
    assert RESOURCES["ShardWorkerFunction"]["Metadata"] == {
        "Dockerfile": "functions/Dockerfile",
        "DockerContext": ".",
        "DockerTag": "python3.12-v1",
    }
    assert (REPO / "functions" / "Dockerfile").is_file()
    assert RESOURCES["SharedLayer"]["Metadata"]["BuildMethod"] == "python3.12"


def test_one_architecture_parameter_for_every_function_and_the_layer() -> None:
    # sam build resolves the layer's BuildArchitecture and each image's platform from the same
    # parameter that deploys the functions on it (samconfig.toml sets it for both commands).
    parameter = TEMPLATE["Parameters"]["Architecture"]
    assert (parameter["Type"], parameter["Default"], parameter["AllowedValues"]) == (
        "String",
        "x86_64",
        ["x86_64", "arm64"],
    )
    assert {function: merged(function)["Architectures"] for function in FUNCTIONS} == {
        function: [{"Ref": "Architecture"}] for function in FUNCTIONS
    }
    layer = RESOURCES["SharedLayer"]
    assert layer["Properties"]["CompatibleArchitectures"] == [{"Ref": "Architecture"}]
    assert layer["Metadata"] == {"BuildMethod": "python3.12", "BuildArchitecture": {"Ref": "Architecture"}}


def test_sqs_event_sources_report_batch_item_failures() -> None:
    sources = sqs_sources()
    assert sorted((function, queue, props.get("BatchSize")) for function, queue, props in sources) == [
        ("AggregatorFunction", "FinalizeQueue", 1),
        ("PrepareFunction", "PrepareQueue", 1),
        ("ShardWorkerFunction", "ShardsQueue", 1),
        ("UploadTriggerFunction", "UploadsQueue", 10),
        ("WebhookFunction", "WebhookQueue", 10),
    ]
    for function, _, props in sources:
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"], function


def test_queue_visibility_timeout_is_at_least_six_times_the_consumer_timeout() -> None:
    pairs = {}
    for function, queue, _ in sqs_sources():
        timeout = merged(function)["Timeout"]
        visibility = RESOURCES[queue]["Properties"]["VisibilityTimeout"]
        assert visibility >= 6 * timeout, f"{queue}: {visibility} s < 6 x {function} {timeout} s"
        pairs[queue] = (visibility, timeout)
    assert pairs == {
        "UploadsQueue": (360, 60),
        "PrepareQueue": (5400, 900),
        "ShardsQueue": (5400, 900),
        "FinalizeQueue": (5400, 900),
        "WebhookQueue": (180, 30),
    }


def test_every_queue_has_its_own_dead_letter_queue() -> None:
    queues = {lid for lid, r in RESOURCES.items() if r["Type"] == "AWS::SQS::Queue"}
    consumed = {queue for _, queue, _ in sqs_sources()}
    dead_letter = {}
    for queue in consumed:
        policy = RESOURCES[queue]["Properties"]["RedrivePolicy"]
        assert policy["maxReceiveCount"] == 5, queue
        target, attribute = policy["deadLetterTargetArn"]["Fn::GetAtt"]
        assert attribute == "Arn"
        dead_letter[queue] = target
    assert dead_letter == {
        "UploadsQueue": "UploadsDeadLetterQueue",
        "PrepareQueue": "PrepareDeadLetterQueue",
        "ShardsQueue": "ShardsDeadLetterQueue",
        "FinalizeQueue": "FinalizeDeadLetterQueue",
        "WebhookQueue": "WebhookDeadLetterQueue",
    }
    # The stream's on-failure destination: no queue feeds it, so it has no DLQ of its own.
    assert queues == consumed | set(dead_letter.values()) | {"StatusEventsDeadLetterQueue"}
    for dlq in [*dead_letter.values(), "StatusEventsDeadLetterQueue"]:
        assert RESOURCES[dlq]["Properties"]["MessageRetentionPeriod"] == 14 * 24 * 3600


def test_uploads_under_inbox_notify_the_uploads_queue() -> None:
    bucket = RESOURCES["DataBucket"]
    assert (
        bucket["DependsOn"] == "UploadsQueuePolicy"
    )  # S3 checks it may send when the notification is created
    assert bucket["Properties"]["NotificationConfiguration"] == {
        "QueueConfigurations": [
            {
                "Event": "s3:ObjectCreated:*",
                "Queue": {"Fn::GetAtt": ["UploadsQueue", "Arn"]},
                "Filter": {
                    "S3Key": {
                        "Rules": [
                            {"Name": "prefix", "Value": "inbox/"},
                            {"Name": "suffix", "Value": ".jsonl"},
                        ]
                    }
                },
            }
        ]
    }
    [statement] = RESOURCES["UploadsQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "s3.amazonaws.com"}
    assert statement["Action"] == "sqs:SendMessage"
    assert sorted(statement["Condition"]) == ["ArnLike", "StringEquals"]


def test_table_keys_index_and_ttl() -> None:
    table = RESOURCES["BatchTable"]["Properties"]
    assert table["KeySchema"] == [
        {"AttributeName": "PK", "KeyType": "HASH"},
        {"AttributeName": "SK", "KeyType": "RANGE"},
    ]
    assert table["GlobalSecondaryIndexes"] == [
        {
            "IndexName": "GSI1",
            "KeySchema": [
                {"AttributeName": "GSI1PK", "KeyType": "HASH"},
                {"AttributeName": "GSI1SK", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "ALL"},
        },
        {  # sparse (data/keys.py): the open batches the sweeper reads, keys only
            "IndexName": "OpenBatches",
            "KeySchema": [
                {"AttributeName": "OPENPK", "KeyType": "HASH"},
                {"AttributeName": "OPENSK", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        },
    ]
    assert {d["AttributeName"] for d in table["AttributeDefinitions"]} == {
        "PK",
        "SK",
        "GSI1PK",
        "GSI1SK",
        "OPENPK",
        "OPENSK",
    }
    assert table["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}
    assert table["BillingMode"] == "PAY_PER_REQUEST"


def test_sam_validate_lint_passes() -> None:
    sam = Path(sys.executable).with_name("sam")
    command = str(sam) if sam.exists() else shutil.which("sam")
    assert command, "aws-sam-cli is not installed (requirements/dev.txt)"
    env = {**os.environ, "SAM_CLI_TELEMETRY": "0", "AWS_DEFAULT_REGION": "us-east-1"}
    env.pop("AWS_ENDPOINT_URL", None)
    result = subprocess.run(
        [command, "validate", "--lint", "--template-file", str(TEMPLATE_PATH)],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is a valid SAM Template" in result.stdout + result.stderr


def test_upload_staging_expires_after_the_longest_upload() -> None:
    # Staged parts and PUTs (api/uploads.py) of abandoned uploads, and anything written after complete or
    # cancel, are deleted a day old; no upload lives longer, so nothing still needed is.
    rules = RESOURCES["DataBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    assert {rule["Id"]: rule for rule in rules}["expire-upload-staging"] == {
        "Id": "expire-upload-staging",
        "Status": "Enabled",
        "Prefix": "uploads/",
        "ExpirationInDays": 1,
    }
    from batchinfer.api.uploads import STAGING_PREFIX
    from batchinfer.core.settings import Settings

    assert STAGING_PREFIX == "uploads/"
    assert Settings.model_fields["upload_expires_seconds"].metadata[-1].le == 24 * 3600


def test_files_are_never_expired_by_the_bucket_only_dead_copies_into_them_aborted() -> None:
    # Uploaded files are kept until deleted (their owner's storage quota bounds them); a complete that
    # died leaves an unfinished multipart copy into files/, aborted a day later.
    rules = RESOURCES["DataBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    assert [rule for rule in rules if rule.get("Prefix", "").startswith("files")] == [
        {
            "Id": "abort-dead-file-copies",
            "Status": "Enabled",
            "Prefix": "files/",
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
        }
    ]
    assert not [rule for rule in rules if "ExpirationInDays" in rule and not rule.get("Prefix")]


def test_every_dead_letter_queue_has_an_alarm() -> None:
    dead_letter_queues = sorted(
        logical_id
        for logical_id, r in RESOURCES.items()
        if r["Type"] == "AWS::SQS::Queue" and logical_id.endswith("DeadLetterQueue")
    )
    watched = sorted(
        r["Properties"]["Dimensions"][0]["Value"]["Fn::GetAtt"][0]
        for r in RESOURCES.values()
        if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"].get("Namespace") == "AWS/SQS"
    )
    assert watched == dead_letter_queues
    assert len(dead_letter_queues) == 6
    for logical_id, r in RESOURCES.items():
        if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"].get("Namespace") == "AWS/SQS":
            p = r["Properties"]
            assert (p["MetricName"], p["Threshold"], p["ComparisonOperator"]) == (
                "ApproximateNumberOfMessagesVisible",
                0,
                "GreaterThanThreshold",
            ), logical_id


def test_the_error_rate_alarm_divides_failed_by_all_requests() -> None:
    metrics = {m["Id"]: m for m in RESOURCES["HighErrorRateAlarm"]["Properties"]["Metrics"]}
    assert metrics["rate"]["Expression"] == "IF(completed + failed > 0, failed / (completed + failed), 0)"
    assert [metrics[i]["MetricStat"]["Metric"]["MetricName"] for i in ("completed", "failed")] == [
        "RequestsCompleted",
        "RequestsFailed",
    ]
    assert RESOURCES["BatchesPastWindowAlarm"]["Properties"]["MetricName"] == "BatchesPastWindow"


def test_status_events_read_the_batch_table_stream_for_header_writes_only() -> None:
    assert RESOURCES["BatchTable"]["Properties"]["StreamSpecification"] == {
        "StreamViewType": "NEW_AND_OLD_IMAGES"
    }
    (event,) = merged("StatusEventsFunction")["Events"].values()
    assert event["Type"] == "DynamoDB"
    assert event["Properties"]["Stream"] == {"Fn::GetAtt": ["BatchTable", "StreamArn"]}
    assert event["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    (pattern,) = (f["Pattern"] for f in event["Properties"]["FilterCriteria"]["Filters"])
    assert json.loads(pattern) == {
        "eventName": ["INSERT", "MODIFY"],
        "dynamodb": {"Keys": {"PK": {"S": [{"prefix": "BATCH#"}]}, "SK": {"S": ["META"]}}},
    }


def test_a_flood_of_api_requests_cannot_take_the_pipeline_s_concurrency() -> None:
    # The HTTP API throttles every route, and the API and the pipeline's busy functions reserve their
    # concurrency: the API at most its own, the pipeline's always available.
    assert RESOURCES["HttpApi"]["Properties"]["DefaultRouteSettings"] == {
        "ThrottlingRateLimit": {"Ref": "ApiThrottleRate"},
        "ThrottlingBurstLimit": {"Ref": "ApiThrottleBurst"},
    }
    reserved = {f: RESOURCES[f]["Properties"].get("ReservedConcurrentExecutions") for f in FUNCTIONS}
    assert {f: n for f, n in reserved.items() if n is not None} == {
        "ApiFunction": {"Ref": "ApiConcurrency"},
        "PrepareFunction": 5,
        "ShardWorkerFunction": {"Ref": "MaxShardWorkers"},
        "AggregatorFunction": 5,
        "TokenInferFunction": {"Ref": "TokenInferConcurrency"},
        "SweeperFunction": 1,
    }
    # Each reservation of a queue consumer is what its event source may run
    for function, _, properties in sqs_sources():
        if function in ("PrepareFunction", "ShardWorkerFunction", "AggregatorFunction"):
            assert properties["ScalingConfig"]["MaximumConcurrency"] == reserved[function]
