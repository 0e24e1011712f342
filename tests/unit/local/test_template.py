"""The local stack's template reading: decoding short-form tags, Globals merging, intrinsic resolution.

Expected values follow the CloudFormation intrinsic function reference
(https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/intrinsic-function-reference.html).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from batchinfer_local.template import Resolver, TemplateError, load_template, merge_function_globals

TEMPLATE: dict[str, Any] = {
    "Parameters": {
        "Size": {"Type": "Number", "Default": 100},
        "Stage": {"Type": "String", "Default": "dev"},
        "Names": {"Type": "CommaDelimitedList", "Default": "a, b,c"},
        "Flag": {"Type": "String", "AllowedValues": ["true", "false"], "Default": "true"},
    },
    "Conditions": {
        "IsProd": {"Fn::Equals": [{"Ref": "Stage"}, "prod"]},
        "IsDev": {"Fn::Not": [{"Condition": "IsProd"}]},
        "DevAndFlag": {"Fn::And": [{"Condition": "IsDev"}, {"Fn::Equals": [{"Ref": "Flag"}, "true"]}]},
        "ProdOrFlag": {"Fn::Or": [{"Condition": "IsProd"}, {"Fn::Equals": [{"Ref": "Flag"}, "true"]}]},
    },
    "Mappings": {"Sizes": {"dev": {"Memory": 512}}},
    "Resources": {"Queue": {"Type": "AWS::SQS::Queue"}},
}


@pytest.fixture
def resolver() -> Resolver:
    resolver = Resolver(TEMPLATE)
    resolver.add_resource(
        "Queue", "https://queue/url", Arn="arn:aws:sqs:us-east-1:123456789012:q", QueueName="q"
    )
    return resolver


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ({"Ref": "Size"}, "100"),  # parameters are strings, whatever their declared type
        ({"Ref": "Names"}, ["a", "b", "c"]),
        ({"Ref": "AWS::Region"}, "us-east-1"),
        ({"Ref": "AWS::AccountId"}, "123456789012"),
        ({"Ref": "AWS::StackName"}, "batchinfer-local"),
        ({"Ref": "Queue"}, "https://queue/url"),
        ({"Fn::GetAtt": ["Queue", "Arn"]}, "arn:aws:sqs:us-east-1:123456789012:q"),
        ({"Fn::GetAtt": "Queue.QueueName"}, "q"),
        (
            {"Fn::Sub": "x-${AWS::AccountId}-${AWS::Region}-${Stage}-${Queue.QueueName}"},
            "x-123456789012-us-east-1-dev-q",
        ),
        ({"Fn::Sub": ["${Greeting}, ${Stage}", {"Greeting": {"Ref": "Size"}}]}, "100, dev"),
        ({"Fn::Sub": "${!Literal}-${Stage}"}, "${Literal}-dev"),
        ({"Fn::Join": ["/", ["a", {"Ref": "Stage"}, "b"]]}, "a/dev/b"),
        ({"Fn::Select": [1, {"Ref": "Names"}]}, "b"),
        ({"Fn::Select": ["2", {"Fn::Split": [",", "x,y,z"]}]}, "z"),
        ({"Fn::If": ["IsProd", "big", "small"]}, "small"),
        ({"Fn::If": ["DevAndFlag", "yes", "no"]}, "yes"),
        ({"Fn::If": ["ProdOrFlag", "yes", "no"]}, "yes"),
        ({"Fn::FindInMap": ["Sizes", {"Ref": "Stage"}, "Memory"]}, 512),
        ({"Fn::FindInMap": ["Sizes", "prod", "Memory", {"DefaultValue": 128}]}, 128),
        ({"Fn::Base64": "hi"}, "aGk="),
        ({"Fn::GetAZs": ""}, ["us-east-1a", "us-east-1b", "us-east-1c"]),
        ({"A": {"Ref": "Stage"}, "B": [1, {"Ref": "Size"}]}, {"A": "dev", "B": [1, "100"]}),
    ],
)
def test_resolves_intrinsics(resolver: Resolver, expression: Any, expected: Any) -> None:
    assert resolver.resolve(expression) == expected


def test_no_value_removes_the_property_or_item(resolver: Resolver) -> None:
    expression = {
        "Keep": 1,
        "Drop": {"Fn::If": ["IsProd", "x", {"Ref": "AWS::NoValue"}]},
        "List": ["a", {"Ref": "AWS::NoValue"}, "b"],
    }
    assert resolver.resolve(expression) == {"Keep": 1, "List": ["a", "b"]}


def test_parameter_overrides_replace_defaults() -> None:
    resolver = Resolver(TEMPLATE, {"Stage": "prod", "Size": 5})
    assert (resolver.resolve({"Ref": "Stage"}), resolver.resolve({"Ref": "Size"})) == ("prod", "5")
    assert resolver.condition("IsProd") is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ({"Ref": "Missing"}, "Environment.Ref: resource Missing (not declared) has no local value"),
        ({"Fn::GetAtt": ["Queue", "Nope"]}, "Environment.Fn::GetAtt: Queue has no local attribute Nope"),
        (
            {"Fn::Sub": "${Missing.Arn}"},
            "Environment.Fn::Sub: resource Missing (not declared) has no local value",
        ),
        ({"Fn::If": ["Unknown", 1, 2]}, "condition Unknown is not declared"),
        ({"Fn::Select": [5, ["a"]]}, "Environment.Fn::Select: Fn::Select index 5 out of range"),
        (
            {"Fn::FindInMap": ["Sizes", "prod", "Memory"]},
            "Environment.Fn::FindInMap: no mapping Sizes.prod.Memory",
        ),
    ],
)
def test_unresolvable_expressions_name_their_location(
    resolver: Resolver, expression: Any, message: str
) -> None:
    with pytest.raises(TemplateError) as error:
        resolver.resolve(expression, "Environment")
    assert str(error.value) == message


def test_declared_but_not_emulated_resource_says_its_type() -> None:
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}
    with pytest.raises(TemplateError) as error:
        Resolver(template).resolve({"Ref": "Topic"}, "X")
    assert str(error.value) == "X.Ref: resource Topic (AWS::SNS::Topic) has no local value"


def test_parameter_errors() -> None:
    with pytest.raises(TemplateError, match=r"^parameter overrides for undeclared parameters: Nope$"):
        Resolver(TEMPLATE, {"Nope": "1"})
    with pytest.raises(TemplateError, match=r"^parameter Required has no Default and no override$"):
        Resolver({"Parameters": {"Required": {"Type": "String"}}, "Resources": {}})


def test_load_template_turns_short_form_tags_into_long_form(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "Resources:\n"
        "  R:\n"
        "    Type: X\n"
        "    Properties:\n"
        "      A: !Ref P\n"
        "      B: !Sub '${AWS::Region}-x'\n"
        "      C: !GetAtt Q.Arn\n"
        "      D: !Join [',', [a, !Ref P]]\n"
        "      E: !If [Cond, !Select [0, !Split [',', 'a,b']], !Ref AWS::NoValue]\n"
    )
    assert load_template(path)["Resources"]["R"]["Properties"] == {
        "A": {"Ref": "P"},
        "B": {"Fn::Sub": "${AWS::Region}-x"},
        "C": {"Fn::GetAtt": ["Q", "Arn"]},
        "D": {"Fn::Join": [",", ["a", {"Ref": "P"}]]},
        "E": {"Fn::If": ["Cond", {"Fn::Select": [0, {"Fn::Split": [",", "a,b"]}]}, {"Ref": "AWS::NoValue"}]},
    }


def test_load_template_errors(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=r"^template not found: "):
        load_template(tmp_path / "missing.yaml")
    (tmp_path / "empty.yaml").write_text("Description: nothing\n")
    with pytest.raises(TemplateError, match=r"has no Resources section$"):
        load_template(tmp_path / "empty.yaml")


def test_globals_merge_like_sam() -> None:
    template = {
        "Globals": {
            "Function": {
                "Runtime": "python3.12",
                "Timeout": 30,
                "Layers": [{"Ref": "L1"}],
                "Environment": {"Variables": {"A": "global", "B": "global"}},
            }
        },
        "Resources": {
            "Zip": {
                "Type": "AWS::Serverless::Function",
                "Properties": {
                    "Timeout": 900,
                    "Layers": [{"Ref": "L2"}],
                    "Environment": {"Variables": {"B": "own"}},
                },
            },
            "Image": {
                "Type": "AWS::Serverless::Function",
                "IgnoreGlobals": ["Runtime"],
                "Properties": {"PackageType": "Image"},
            },
        },
    }
    assert merge_function_globals(template, "Zip") == {
        "Runtime": "python3.12",
        "Timeout": 900,
        "Layers": [{"Ref": "L1"}, {"Ref": "L2"}],  # lists concatenate, globals first
        "Environment": {"Variables": {"A": "global", "B": "own"}},
    }
    assert merge_function_globals(template, "Image") == {
        "PackageType": "Image",
        "Timeout": 30,
        "Layers": [{"Ref": "L1"}],
        "Environment": {"Variables": {"A": "global", "B": "global"}},
    }
    with pytest.raises(TemplateError, match=r"^Nope is not an AWS::Serverless::Function$"):
        merge_function_globals(template, "Nope")
