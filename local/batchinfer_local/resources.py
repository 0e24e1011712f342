"""Create the template's stateful resources (DynamoDB tables, S3 buckets, SQS queues) in moto.

Physical names follow the template (`TableName`, `BucketName`, `QueueName`) or, when it gives
none, `<stack>-<LogicalId>` (CloudFormation would add a random suffix; locally names are stable).
Properties with no local meaning (encryption, point-in-time recovery, public access blocks,
queue/bucket policies: moto enforces no IAM) are not applied.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .template import Resolver, TemplateError

log = logging.getLogger(__name__)

TABLE = "AWS::DynamoDB::Table"
BUCKET = "AWS::S3::Bucket"
QUEUE = "AWS::SQS::Queue"

# Declared but deliberately not emulated: they only grant access, which moto does not check, or
# are modelled by the runtime (functions, layers, the HTTP API).
NOT_EMULATED = frozenset(
    {
        "AWS::SQS::QueuePolicy",
        "AWS::S3::BucketPolicy",
        "AWS::Serverless::Function",
        "AWS::Serverless::LayerVersion",
        "AWS::Serverless::HttpApi",
        "AWS::Serverless::Api",
        "AWS::IAM::Role",
        "AWS::IAM::Policy",
        "AWS::IAM::ManagedPolicy",
        "AWS::Logs::LogGroup",
        # Alarms and dashboards watch metrics, which the local stack does not collect (the functions'
        # EMF lines are in their logs).
        "AWS::CloudWatch::Alarm",
        "AWS::CloudWatch::Dashboard",
    }
)

# CloudFormation AWS::SQS::Queue properties that are SetQueueAttributes attributes of the same name.
_QUEUE_ATTRIBUTES = (
    "VisibilityTimeout",
    "MessageRetentionPeriod",
    "DelaySeconds",
    "MaximumMessageSize",
    "ReceiveMessageWaitTimeSeconds",
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
)


@dataclass
class Resources:
    """Physical identities of the created resources, by logical id.

    `queue_urls`/`queue_arns` include dead-letter queues; `redrive` maps a queue's logical id
    to `(dlq_logical_id, maxReceiveCount)`; `visibility_timeouts` is in seconds; `notification_queues` are the
    queues S3 notifications go to.
    """

    tables: dict[str, str] = field(default_factory=dict)
    buckets: dict[str, str] = field(default_factory=dict)
    queue_urls: dict[str, str] = field(default_factory=dict)
    queue_arns: dict[str, str] = field(default_factory=dict)
    redrive: dict[str, tuple[str, int]] = field(default_factory=dict)
    visibility_timeouts: dict[str, int] = field(default_factory=dict)
    notification_queues: set[str] = field(default_factory=set)

    def queue_by_arn(self, arn: str) -> str:
        """The logical id of the queue with `arn`.

        Raises:
            TemplateError: no declared queue has that ARN.
        """
        for logical_id, queue_arn in self.queue_arns.items():
            if queue_arn == arn:
                return logical_id
        raise TemplateError(f"no queue of the template has ARN {arn}")


def _physical_name(resolver: Resolver, logical_id: str, properties: Mapping[str, Any], key: str) -> str:
    if key in properties:
        return str(resolver.resolve(properties[key], f"{logical_id}.{key}"))
    return f"{resolver.pseudo['AWS::StackName']}-{logical_id}"


def _string_attribute(value: Any) -> str:
    # SQS attributes are strings; CloudFormation YAML gives ints and booleans.
    return str(value).lower() if isinstance(value, bool) else str(value)


def create_resources(
    template: Mapping[str, Any], resolver: Resolver, clients: Mapping[str, Any]
) -> Resources:
    """Create every table, bucket and queue of `template` and register them with `resolver`.

    `clients` holds boto3 clients under "dynamodb", "s3" and "sqs" (pointed at moto).
    Order: queues (then their redrive policies, as a DLQ may be declared after its queue),
    tables, buckets (then their notifications, which need the queues).

    Raises:
        TemplateError: an expression cannot be resolved, or a bucket notification targets
            something other than a queue of the template.
    """
    by_type: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for logical_id, resource in template["Resources"].items():
        kind = resource.get("Type", "")
        if "Condition" in resource and not resolver.condition(resource["Condition"]):
            continue
        by_type.setdefault(kind, []).append((logical_id, resource.get("Properties") or {}))
        if kind not in (TABLE, BUCKET, QUEUE) and kind not in NOT_EMULATED:
            log.warning("%s (%s) is not emulated by the local stack", logical_id, kind)
    made = Resources()
    _create_queues(clients["sqs"], resolver, made, by_type.get(QUEUE, []))
    for logical_id, properties in by_type.get(TABLE, []):
        _create_table(clients["dynamodb"], resolver, made, logical_id, properties)
    buckets = by_type.get(BUCKET, [])
    for logical_id, properties in buckets:
        _create_bucket(clients["s3"], resolver, made, logical_id, properties)
    for logical_id, properties in buckets:
        if "NotificationConfiguration" in properties:
            notification = resolver.resolve(
                properties["NotificationConfiguration"], f"{logical_id}.Notification"
            )
            _put_notifications(clients["s3"], made, logical_id, notification)
    return made


def _create_queues(
    sqs: Any, resolver: Resolver, made: Resources, queues: list[tuple[str, dict[str, Any]]]
) -> None:
    """Every queue, then their redrive policies (a DLQ may be declared after its queue)."""
    region, account = resolver.pseudo["AWS::Region"], resolver.pseudo["AWS::AccountId"]
    for logical_id, properties in queues:
        name = _physical_name(resolver, logical_id, properties, "QueueName")
        if properties.get("FifoQueue") and "QueueName" not in properties:
            name += ".fifo"
        resolved = resolver.resolve(
            {key: properties[key] for key in _QUEUE_ATTRIBUTES if key in properties}, logical_id
        )
        attributes = {key: _string_attribute(value) for key, value in resolved.items()}
        url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        arn = f"arn:aws:sqs:{region}:{account}:{name}"
        made.queue_urls[logical_id], made.queue_arns[logical_id] = url, arn
        made.visibility_timeouts[logical_id] = int(attributes.get("VisibilityTimeout", 30))
        resolver.add_resource(logical_id, url, Arn=arn, QueueName=name, QueueUrl=url)
    for logical_id, properties in queues:
        if "RedrivePolicy" not in properties:
            continue
        policy = resolver.resolve(properties["RedrivePolicy"], f"{logical_id}.RedrivePolicy")
        if isinstance(policy, str):
            policy = json.loads(policy)
        made.redrive[logical_id] = (
            made.queue_by_arn(policy["deadLetterTargetArn"]),
            int(policy["maxReceiveCount"]),
        )
        sqs.set_queue_attributes(
            QueueUrl=made.queue_urls[logical_id], Attributes={"RedrivePolicy": json.dumps(policy)}
        )


def _create_table(
    dynamodb: Any, resolver: Resolver, made: Resources, logical_id: str, properties: dict[str, Any]
) -> None:
    name = _physical_name(resolver, logical_id, properties, "TableName")
    spec = resolver.resolve(properties, logical_id)
    request: dict[str, Any] = {
        "TableName": name,
        "AttributeDefinitions": spec["AttributeDefinitions"],
        "KeySchema": spec["KeySchema"],
        "BillingMode": spec.get("BillingMode", "PROVISIONED"),
    }
    for key in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes", "ProvisionedThroughput"):
        if key in spec:
            request[key] = spec[key]
    if "StreamSpecification" in spec:
        request["StreamSpecification"] = {"StreamEnabled": True, **spec["StreamSpecification"]}
    table = dynamodb.create_table(**request)["TableDescription"]
    ttl = spec.get("TimeToLiveSpecification")
    if ttl and ttl.get("Enabled") in (True, "true"):
        dynamodb.update_time_to_live(
            TableName=name,
            TimeToLiveSpecification={"AttributeName": ttl["AttributeName"], "Enabled": True},
        )
    made.tables[logical_id] = name
    attributes = {"Arn": table["TableArn"]}
    if "LatestStreamArn" in table:
        attributes["StreamArn"] = table["LatestStreamArn"]
    resolver.add_resource(logical_id, name, **attributes)


def _create_bucket(
    s3: Any, resolver: Resolver, made: Resources, logical_id: str, properties: dict[str, Any]
) -> None:
    region = resolver.pseudo["AWS::Region"]
    name = _physical_name(resolver, logical_id, properties, "BucketName").lower()
    if region == "us-east-1":
        s3.create_bucket(Bucket=name)
    else:
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})
    made.buckets[logical_id] = name
    resolver.add_resource(
        logical_id,
        name,
        Arn=f"arn:aws:s3:::{name}",
        DomainName=f"{name}.s3.amazonaws.com",
        RegionalDomainName=f"{name}.s3.{region}.amazonaws.com",
    )


def _put_notifications(s3: Any, made: Resources, logical_id: str, notification: Mapping[str, Any]) -> None:
    """Translate CloudFormation's QueueConfigurations to PutBucketNotificationConfiguration's shape."""
    for unsupported in ("LambdaConfigurations", "TopicConfigurations", "EventBridgeConfiguration"):
        if unsupported in notification:
            raise TemplateError(
                f"{logical_id}: {unsupported} is not emulated locally (only QueueConfigurations)"
            )
    configurations = []
    for index, item in enumerate(notification.get("QueueConfigurations", [])):
        made.notification_queues.add(made.queue_by_arn(item["Queue"]))  # must be a queue of this template
        configuration: dict[str, Any] = {
            "Id": f"{logical_id}-{index}",
            "QueueArn": item["Queue"],
            "Events": [item["Event"]],
        }
        rules = ((item.get("Filter") or {}).get("S3Key") or {}).get("Rules")
        if rules:
            configuration["Filter"] = {
                "Key": {"FilterRules": [{"Name": r["Name"], "Value": r["Value"]} for r in rules]}
            }
        configurations.append(configuration)
    if configurations:
        # moto delivers to SQS, honouring prefix/suffix rules; like S3 it first sends an s3:TestEvent.
        s3.put_bucket_notification_configuration(
            Bucket=made.buckets[logical_id], NotificationConfiguration={"QueueConfigurations": configurations}
        )
