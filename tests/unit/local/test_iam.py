"""The roles SAM makes of template.yaml's `Policies` (`iam.sam_roles`), resolved as the local stack does,
evaluated with moto's own policy evaluator (`moto.iam.access_control.IAMPolicy`).

Includes the check that every `backend: bedrock` model of the registry file is one the shard worker
may invoke (template parameter BedrockModelIds).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from moto.iam.access_control import IAMPolicy, PermissionResult

from batchinfer.backends.registry import ModelRegistry, load_registry
from batchinfer.core.settings import DEFAULT_REGISTRY
from batchinfer_local import moto_auth
from batchinfer_local.iam import RoleSpec, sam_roles
from batchinfer_local.template import Resolver, load_template

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = load_template(REPO / "template.yaml")
SQS_EXECUTION = "arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole"
STREAM_EXECUTION = "arn:aws:iam::aws:policy/service-role/AWSLambdaDynamoDBExecutionRole"
TABLE = "arn:aws:dynamodb:us-east-1:123456789012:table/batchinfer-local-BatchTable"
BASIC = [
    "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
    "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess",
]


@pytest.fixture(autouse=True)
def iam_wildcards() -> Iterator[None]:
    """IAM's `?` wildcard (moto_auth's fix of moto's matching), as the local stack evaluates policies."""
    moto_auth.install()
    yield
    moto_auth.uninstall()


def roles(parameters: dict[str, Any] | None = None) -> dict[str, RoleSpec]:
    """Every function's role, resolved against stand-in resources named as the local stack names them."""
    resolver = Resolver(TEMPLATE, parameters or {})
    resolver.add_resource(
        "BatchTable",
        "batchinfer-local-BatchTable",
        Arn=f"{TABLE}",
        StreamArn=f"{TABLE}/stream/2026-01-01T00:00:00.000",
    )
    for queue in (
        "UploadsQueue",
        "PrepareQueue",
        "ShardsQueue",
        "FinalizeQueue",
        "WebhookQueue",
        "StatusEventsDeadLetterQueue",
    ):
        resolver.add_resource(
            queue,
            f"https://local/{queue}",
            QueueName=f"batchinfer-local-{queue}",
            Arn=f"arn:aws:sqs:us-east-1:123456789012:batchinfer-local-{queue}",
        )
    return {
        function: role.resolve(resolver)
        for function, role in sam_roles(TEMPLATE, resolver.parameters).items()
    }


def allowed(role: RoleSpec, action: str, resource: str) -> bool:
    """Whether the role's inline policies allow `action` on `resource` (no deny statements exist)."""
    return any(
        IAMPolicy(json.dumps(document)).is_action_permitted(action, resource) == PermissionResult.PERMITTED
        for document in role.inline_policies.values()
    )


def actions(role: RoleSpec) -> set[str]:
    found: set[str] = set()
    for statement in role.statements():
        found.update([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    return found


def test_one_role_per_function_with_the_managed_policies_sam_attaches() -> None:
    resolved = roles()
    assert {
        function: (role.role_logical_id, list(role.managed_policy_arns))
        for function, role in resolved.items()
    } == {
        "ApiFunction": ("ApiFunctionRole", BASIC),
        "UploadTriggerFunction": ("UploadTriggerFunctionRole", [*BASIC, SQS_EXECUTION]),
        "PrepareFunction": ("PrepareFunctionRole", [*BASIC, SQS_EXECUTION]),
        "ShardWorkerFunction": ("ShardWorkerFunctionRole", [*BASIC, SQS_EXECUTION]),
        "TokenInferFunction": ("TokenInferFunctionRole", BASIC),
        "AggregatorFunction": ("AggregatorFunctionRole", [*BASIC, SQS_EXECUTION]),
        "SweeperFunction": ("SweeperFunctionRole", BASIC),
        "StatusEventsFunction": ("StatusEventsFunctionRole", [*BASIC, STREAM_EXECUTION]),
        "WebhookFunction": ("WebhookFunctionRole", [*BASIC, SQS_EXECUTION]),
    }
    # /v2: its caller's key and account, its in-flight slots (data/inflight.py); nothing else.
    assert actions(resolved["TokenInferFunction"]) == {
        "dynamodb:GetItem",
        "dynamodb:Query",
        "dynamodb:PutItem",
        "dynamodb:DeleteItem",
    }
    # Policy templates are expanded (DynamoDBCrudPolicy's actions); no role names TransactWriteItems,
    # which AWS authorizes item by item.
    assert "dynamodb:ConditionCheckItem" in actions(resolved["ApiFunction"])
    assert not any("dynamodb:TransactWriteItems" in actions(role) for role in resolved.values())
    # Status events: EventBridge and the webhook queue, no table access but its stream (managed policy).
    assert not any(a.startswith("dynamodb:") for a in actions(resolved["StatusEventsFunction"]))
    assert allowed(
        resolved["StatusEventsFunction"],
        "events:PutEvents",
        "arn:aws:events:us-east-1:123456789012:event-bus/default",
    )
    # Webhooks: read the account's settings, never write the table.
    webhook = resolved["WebhookFunction"]
    assert allowed(webhook, "dynamodb:GetItem", TABLE) and not allowed(webhook, "dynamodb:PutItem", TABLE)
    assert allowed(
        webhook,
        "sqs:ChangeMessageVisibility",
        "arn:aws:sqs:us-east-1:123456789012:batchinfer-local-WebhookQueue",
    )


DATA = "arn:aws:s3:::batchinfer-123456789012-us-east-1-data"
USER = "arn:aws:s3:::batchinfer-user-acme"


@pytest.mark.parametrize(
    ("function", "action", "resource", "expected"),
    [
        # Every delete of the service bucket belongs to a route of the API.
        ("ApiFunction", "s3:DeleteObject", f"{DATA}/files/file-1", True),
        ("ApiFunction", "s3:DeleteObject", f"{DATA}/batches/b/output.jsonl", True),
        ("ApiFunction", "s3:DeleteObject", f"{DATA}/batches/b/shards/00000.jsonl", False),
        ("PrepareFunction", "s3:DeleteObject", f"{DATA}/files/file-1", False),
        # A result key no commit names (a refused writer's, a recovered part's source) is deleted by
        # the writer that knows it (a refused writer cleans up after itself); nothing else of the work prefix.
        ("ShardWorkerFunction", "s3:DeleteObject", f"{DATA}/batches/b/results/00000.00000.t.jsonl", True),
        ("ShardWorkerFunction", "s3:DeleteObject", f"{DATA}/batches/b/shards/00000.jsonl", False),
        ("AggregatorFunction", "s3:DeleteObject", f"{DATA}/batches/b/output.jsonl", False),
        ("AggregatorFunction", "s3:DeleteObject", f"{DATA}/batches/b/results/00000.00000.t.jsonl", True),
        ("AggregatorFunction", "s3:PutObject", f"{DATA}/batches/b/results/00000.00000.t.jsonl", True),
        ("AggregatorFunction", "s3:DeleteObject", f"{DATA}/batches/b/shards/00000.jsonl", False),
        ("SweeperFunction", "s3:DeleteObject", f"{DATA}/batches/b/results/00000.00000.t.jsonl", True),
        ("SweeperFunction", "s3:DeleteObject", f"{DATA}/batches/b/shards/00000.jsonl", False),
        # User buckets: the API reads and deletes a result file (DELETE /v1/files);
        # the aggregator only writes.
        ("ApiFunction", "s3:GetObject", f"{USER}/in/batch.jsonl", True),
        ("ApiFunction", "s3:DeleteObject", f"{USER}/results/b/output.jsonl", True),
        ("ApiFunction", "s3:PutObject", f"{USER}/results/b/output.jsonl", False),
        ("AggregatorFunction", "s3:PutObject", f"{USER}/results/b/output.jsonl", True),
        ("AggregatorFunction", "s3:GetObject", f"{USER}/results/b/output.jsonl", False),
        ("AggregatorFunction", "s3:DeleteObject", f"{USER}/results/b/output.jsonl", False),
        ("PrepareFunction", "s3:GetObject", f"{USER}/in/batch.jsonl", True),
        ("ShardWorkerFunction", "s3:GetObject", f"{USER}/in/batch.jsonl", False),
        # Each function reads the prefixes it uses, and only those.
        ("UploadTriggerFunction", "s3:GetObject", f"{DATA}/inbox/a.jsonl", False),
        ("PrepareFunction", "s3:GetObject", f"{DATA}/inbox/a.jsonl", True),
        ("PrepareFunction", "s3:GetObject", f"{DATA}/files/file-1", True),
        ("PrepareFunction", "s3:GetObject", f"{DATA}/batches/b/results/00000.00000.jsonl", False),
        ("PrepareFunction", "s3:PutObject", f"{DATA}/batches/b/shards/00000.jsonl", True),
        ("ShardWorkerFunction", "s3:GetObject", f"{DATA}/batches/b/shards/00000.jsonl", True),
        ("ShardWorkerFunction", "s3:GetObject", f"{DATA}/files/file-1", False),
        ("ShardWorkerFunction", "s3:PutObject", f"{DATA}/batches/b/results/00000.00000.jsonl", True),
        ("ShardWorkerFunction", "s3:PutObject", f"{DATA}/batches/b/output.jsonl", False),
        ("AggregatorFunction", "s3:GetObject", f"{DATA}/batches/b/results/00000.00000.jsonl", True),
        ("AggregatorFunction", "s3:PutObject", f"{DATA}/outbox/a/output.jsonl", True),
        ("AggregatorFunction", "s3:GetObject", f"{DATA}/files/file-1", False),
        ("ApiFunction", "s3:GetObject", f"{DATA}/batches/b/shards/00000.jsonl", False),
        ("SweeperFunction", "s3:GetObject", f"{DATA}/batches/b/shards/00000.jsonl", True),
        # Queues: who may send where (the cancel route hands a batch to the aggregator).
        (
            "ApiFunction",
            "sqs:SendMessage",
            "arn:aws:sqs:us-east-1:123456789012:batchinfer-local-FinalizeQueue",
            True,
        ),
        (
            "ApiFunction",
            "sqs:SendMessage",
            "arn:aws:sqs:us-east-1:123456789012:batchinfer-local-ShardsQueue",
            False,
        ),
        (
            "PrepareFunction",
            "sqs:SendMessage",
            "arn:aws:sqs:us-east-1:123456789012:batchinfer-local-FinalizeQueue",
            False,
        ),
        # COS credentials: the secret's ARN ends in six random characters (IAM's `?`).
        (
            "ApiFunction",
            "secretsmanager:GetSecretValue",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:batchinfer/cos-AbC123",
            True,
        ),
        (
            "ApiFunction",
            "secretsmanager:GetSecretValue",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:batchinfer/cos-extra-AbC123",
            False,
        ),
        (
            "ShardWorkerFunction",
            "secretsmanager:GetSecretValue",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:batchinfer/cos-AbC123",
            False,
        ),
    ],
)
def test_least_privilege(function: str, action: str, resource: str, expected: bool) -> None:
    assert allowed(roles()[function], action, resource) is expected


def test_no_function_may_call_bedrock_while_no_model_id_is_listed() -> None:
    for function, role in roles().items():
        assert not any(action.startswith("bedrock:") for action in actions(role)), function


def test_the_shard_worker_may_invoke_exactly_the_listed_bedrock_models() -> None:
    resolved = roles(
        {"BedrockModelIds": "amazon.nova-micro-v1:0,us.amazon.nova-lite-v1:0,amazon.nova-lite-v1:0"}
    )
    worker = resolved["ShardWorkerFunction"]
    for region in ("us-east-1", "eu-west-1"):
        assert allowed(
            worker,
            "bedrock:InvokeModel",
            f"arn:aws:bedrock:{region}::foundation-model/amazon.nova-micro-v1:0",
        )
    assert allowed(
        worker,
        "bedrock:InvokeModel",
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-lite-v1:0",
    )
    assert not allowed(
        worker, "bedrock:InvokeModel", "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0"
    )
    assert not allowed(
        worker,
        "bedrock:InvokeModelWithResponseStream",
        "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-micro-v1:0",
    )
    assert [f for f, role in resolved.items() if any(a.startswith("bedrock:") for a in actions(role))] == [
        "ShardWorkerFunction"
    ]


def uncovered(registry: ModelRegistry, worker: RoleSpec) -> list[str]:
    """The registry's bedrock models the shard worker may not invoke (in their own region, or us-east-1)."""
    missing = []
    for name in registry.names():
        config = registry.config(name)
        if config.backend != "bedrock":
            continue
        region = getattr(config, "region", None) or "us-east-1"
        model = f"arn:aws:bedrock:{region}::foundation-model/{config.model_id}"
        profile = f"arn:aws:bedrock:{region}:123456789012:inference-profile/{config.model_id}"
        if not (
            allowed(worker, "bedrock:InvokeModel", model) or allowed(worker, "bedrock:InvokeModel", profile)
        ):
            missing.append(name)
    return missing


def test_every_bedrock_model_of_the_registry_file_is_covered_by_bedrock_model_ids() -> None:
    assert uncovered(load_registry(DEFAULT_REGISTRY), roles()["ShardWorkerFunction"]) == []


def test_a_bedrock_model_missing_from_bedrock_model_ids_is_found() -> None:
    registry = ModelRegistry.from_dict(
        {
            "models": {
                "nova": {"backend": "bedrock", "model_id": "amazon.nova-micro-v1:0", "region": "eu-west-1"},
                "listed": {"backend": "bedrock", "model_id": "amazon.nova-lite-v1:0"},
            }
        }
    )
    worker = roles({"BedrockModelIds": "amazon.nova-lite-v1:0"})["ShardWorkerFunction"]
    assert uncovered(registry, worker) == ["nova"]


def test_embedding_models_are_invoked_only_when_listed_in_bedrock_model_ids() -> None:
    # Given Titan and Cohere embedding models, only Titan listed
    registry = ModelRegistry.from_dict(
        {
            "models": {
                "titan": {"backend": "bedrock", "model_id": "amazon.titan-embed-text-v2:0"},
                "cohere": {"backend": "bedrock", "model_id": "cohere.embed-english-v3"},
            }
        }
    )
    worker = roles({"BedrockModelIds": "amazon.nova-micro-v1:0,amazon.titan-embed-text-v2:0"})[
        "ShardWorkerFunction"
    ]

    # When / Then: the shard worker may invoke exactly the listed ones
    assert uncovered(registry, worker) == ["cohere"]
