"""Load a SAM template and resolve the CloudFormation intrinsic functions the local stack needs.

The template is decoded with cfn-lint's decoder (it understands the short-form tags `!Ref`,
`!Sub`, `!GetAtt`, ...) and function properties get their `Globals` merged by the SAM translator's
own `Globals` class, so the local stack reads the template exactly as `sam` does.

The `Resolver` below resolves intrinsics against the local stack's values. It implements the
documented semantics of
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/intrinsic-function-reference.html for
Ref, Fn::Sub, Fn::GetAtt, Fn::Join, Fn::Select, Fn::Split, Fn::If, Fn::Equals, Fn::Not, Fn::And,
Fn::Or, Condition, Fn::FindInMap, Fn::Base64 and Fn::GetAZs. cfn-lint and the SAM translator only
validate intrinsics or pass them through. SAM CLI's `samcli.lib.intrinsic_resolver.IntrinsicResolver`
(with an `IntrinsicsSymbolTable` holding the created resources) does resolve them, but it was tried on
these cases and differs from CloudFormation where this template depends on it:
- `Ref: AWS::NoValue` becomes None instead of removing the property: `Fn::If [C, !Ref AWS::NoValue, x]`
  raises "Missing Intrinsic property in Fn::If";
- a `Ref` to a parameter gives its Default as declared (`10` for a Number, where CloudFormation gives
  "10"; a CommaDelimitedList stays one string, so `Fn::Select` over it fails);
- a `Ref` or `Fn::GetAtt` to a resource it does not know resolves to the logical id or a made-up
  Lambda ARN instead of failing, which would hide a resource the local stack does not emulate;
- `Fn::Sub` leaves `${!Literal}` as is instead of rendering `${Literal}`.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

SERVERLESS_FUNCTION = "AWS::Serverless::Function"

# Pseudo-parameter values of the local stack (AWS::AccountId is moto's default account).
LOCAL_ACCOUNT_ID = "123456789012"
LOCAL_REGION = "us-east-1"
LOCAL_STACK_NAME = "batchinfer-local"


class TemplateError(ValueError):
    """The template cannot be loaded or an expression in it cannot be resolved locally."""


class _NoValue:
    """`Ref: AWS::NoValue`: the enclosing property or list item is removed."""

    def __repr__(self) -> str:
        return "AWS::NoValue"


NO_VALUE = _NoValue()


def load_template(path: str | Path) -> dict[str, Any]:
    """Decode a CloudFormation/SAM YAML or JSON template into plain dicts, lists and scalars.

    Short-form tags come back in long form (`!Ref X` -> `{"Ref": "X"}`).

    Raises:
        TemplateError: the file is missing or is not a valid template document.
    """
    from cfnlint.decode import cfn_yaml  # here: function processes import this module, not the decoder

    path = Path(path)
    if not path.is_file():
        raise TemplateError(f"template not found: {path}")
    try:
        decoded = cfn_yaml.load(str(path))
    except Exception as exc:  # cfn-lint raises its own CfnParseError or yaml errors
        raise TemplateError(f"cannot decode {path}: {exc}") from exc
    if not isinstance(decoded, dict) or not isinstance(decoded.get("Resources"), dict):
        raise TemplateError(f"{path} has no Resources section")
    # cfn-lint returns str/dict subclasses carrying line marks; plain types copy and compare simply.
    return json.loads(json.dumps(decoded))


def merge_function_globals(template: Mapping[str, Any], logical_id: str) -> dict[str, Any]:
    """A copy of the `AWS::Serverless::Function` properties of `logical_id` with `Globals.Function` merged.

    Uses the SAM translator's merge rules (maps deep-merged, lists concatenated, scalars
    overridden by the function) and honours the `IgnoreGlobals` resource attribute.

    Raises:
        TemplateError: `logical_id` is not a serverless function, or Globals is invalid.
    """
    from samtranslator.plugins.globals.globals import Globals

    resource = template["Resources"].get(logical_id)
    if not resource or resource.get("Type") != SERVERLESS_FUNCTION:
        raise TemplateError(f"{logical_id} is not an {SERVERLESS_FUNCTION}")
    properties = copy.deepcopy(resource.get("Properties") or {})
    try:
        merged = Globals(copy.deepcopy(dict(template))).merge(
            SERVERLESS_FUNCTION, properties, logical_id, resource.get("IgnoreGlobals")
        )
    except Exception as exc:  # samtranslator raises its own exception types
        raise TemplateError(f"{logical_id}: cannot merge Globals: {exc}") from exc
    return dict(merged)


@dataclass
class ResourceRef:
    """What a resource resolves to: `ref` for `Ref`, `attributes` for `Fn::GetAtt`."""

    ref: Any
    attributes: dict[str, Any] = field(default_factory=dict)


_SUB_VARIABLE = re.compile(r"\$\{([^}]*)\}")


class Resolver:
    """Resolves intrinsic functions against parameter values, pseudo parameters and known resources.

    Args:
        template: the decoded template (for Parameters defaults, Conditions and Mappings).
        parameter_overrides: parameter values replacing the declared `Default`s (CloudFormation
            passes parameters as strings; `CommaDelimitedList` and `List<...>` become lists).
        pseudo_parameters: values for `AWS::AccountId`, `AWS::Region`, `AWS::StackName`, ...
            (defaults: the local account, region and stack name).

    Raises:
        TemplateError: a parameter has neither an override nor a default, or an override names
            an undeclared parameter.
    """

    def __init__(
        self,
        template: Mapping[str, Any],
        parameter_overrides: Mapping[str, Any] | None = None,
        pseudo_parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self._template = template
        self._resources: dict[str, ResourceRef] = {}
        region = (pseudo_parameters or {}).get("AWS::Region", LOCAL_REGION)
        account = (pseudo_parameters or {}).get("AWS::AccountId", LOCAL_ACCOUNT_ID)
        stack = (pseudo_parameters or {}).get("AWS::StackName", LOCAL_STACK_NAME)
        self.pseudo: dict[str, Any] = {
            "AWS::AccountId": account,
            "AWS::Region": region,
            "AWS::StackName": stack,
            "AWS::StackId": f"arn:aws:cloudformation:{region}:{account}:stack/{stack}/local",
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NotificationARNs": [],
            "AWS::NoValue": NO_VALUE,
        }
        self.pseudo.update(pseudo_parameters or {})
        self.parameters = self._parameter_values(parameter_overrides or {})
        self._conditions: dict[str, bool] = {}

    def _parameter_values(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        declared = self._template.get("Parameters") or {}
        unknown = sorted(set(overrides) - set(declared))
        if unknown:
            raise TemplateError(f"parameter overrides for undeclared parameters: {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for name, spec in declared.items():
            if name in overrides:
                value = overrides[name]
            elif "Default" in spec:
                value = spec["Default"]
            else:
                raise TemplateError(f"parameter {name} has no Default and no override")
            kind = str(spec.get("Type", "String"))
            if (kind == "CommaDelimitedList" or kind.startswith("List<")) and isinstance(value, str):
                value = [item.strip() for item in value.split(",")]
            elif isinstance(value, bool):
                value = str(value).lower()
            elif isinstance(value, int | float):
                value = str(value)  # a Ref to a Number parameter is a string in CloudFormation
            values[name] = value
        return values

    def add_resource(self, logical_id: str, ref: Any, **attributes: Any) -> None:
        """Make `logical_id` resolvable: `Ref` gives `ref`, `Fn::GetAtt [logical_id, K]` gives
        `attributes[K]`."""
        self._resources[logical_id] = ResourceRef(ref, dict(attributes))

    def resource(self, logical_id: str) -> ResourceRef:
        """The registered values of a resource.

        Raises:
            TemplateError: the resource was not registered (not emulated locally).
        """
        try:
            return self._resources[logical_id]
        except KeyError:
            declared = (self._template.get("Resources") or {}).get(logical_id)
            kind = f" ({declared.get('Type')})" if declared else " (not declared)"
            raise TemplateError(f"resource {logical_id}{kind} has no local value") from None

    # ------------------------------------------------------------------ evaluation
    def resolve(self, value: Any, where: str = "") -> Any:
        """`value` with every intrinsic function replaced by its local value.

        `where` names the location for error messages (e.g. "ApiFunction.Environment").

        Raises:
            TemplateError: an unsupported function, an unknown reference or a malformed argument.
        """
        result = self._resolve(value, where or "template")
        return None if result is NO_VALUE else result

    def condition(self, name: str) -> bool:
        """The truth value of the template condition `name`.

        Raises:
            TemplateError: the condition is not declared.
        """
        if name not in self._conditions:
            conditions = self._template.get("Conditions") or {}
            if name not in conditions:
                raise TemplateError(f"condition {name} is not declared")
            self._conditions[name] = bool(self._resolve(conditions[name], f"Conditions.{name}"))
        return self._conditions[name]

    def _resolve(self, value: Any, where: str) -> Any:
        if isinstance(value, list):
            items = (self._resolve(item, f"{where}[{i}]") for i, item in enumerate(value))
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            function = self._FUNCTIONS.get(key)
            if function is not None:
                return function(self, argument, f"{where}.{key}")
        resolved = {key: self._resolve(item, f"{where}.{key}") for key, item in value.items()}
        return {key: item for key, item in resolved.items() if item is not NO_VALUE}

    def _ref(self, name: Any, where: str) -> Any:
        if not isinstance(name, str):
            raise TemplateError(f"{where}: Ref takes a name, got {name!r}")
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        try:
            return self.resource(name).ref
        except TemplateError as exc:
            raise TemplateError(f"{where}: {exc}") from None

    def _get_att(self, argument: Any, where: str) -> Any:
        if isinstance(argument, str):
            logical_id, _, attribute = argument.partition(".")
        elif isinstance(argument, list) and len(argument) == 2:
            logical_id, attribute = argument[0], self._resolve(argument[1], where)
        else:
            raise TemplateError(f"{where}: Fn::GetAtt takes [LogicalId, Attribute], got {argument!r}")
        try:
            attributes = self.resource(logical_id).attributes
        except TemplateError as exc:
            raise TemplateError(f"{where}: {exc}") from None
        if attribute not in attributes:
            raise TemplateError(f"{where}: {logical_id} has no local attribute {attribute}")
        return attributes[attribute]

    def _sub(self, argument: Any, where: str) -> str:
        if isinstance(argument, str):
            text, variables = argument, {}
        elif isinstance(argument, list) and len(argument) == 2 and isinstance(argument[0], str):
            text, variables = argument[0], self._resolve(argument[1], where)
        else:
            raise TemplateError(f"{where}: Fn::Sub takes a string or [string, {{vars}}], got {argument!r}")

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):  # ${!Literal} renders as ${Literal}
                return "${" + name[1:] + "}"
            if name in variables:
                found = variables[name]
            elif "." in name and not name.startswith("AWS::"):
                found = self._get_att(name, where)
            else:
                found = self._ref(name, where)
            if isinstance(found, list | dict):
                raise TemplateError(f"{where}: ${{{name}}} is not a string")
            return str(found)

        return _SUB_VARIABLE.sub(substitute, text)

    def _join(self, argument: Any, where: str) -> str:
        if not (isinstance(argument, list) and len(argument) == 2):
            raise TemplateError(f"{where}: Fn::Join takes [delimiter, [values]], got {argument!r}")
        delimiter, items = argument[0], self._resolve(argument[1], where)
        if not isinstance(items, list):
            raise TemplateError(f"{where}: Fn::Join values must be a list")
        return str(delimiter).join(str(item) for item in items)

    def _select(self, argument: Any, where: str) -> Any:
        if not (isinstance(argument, list) and len(argument) == 2):
            raise TemplateError(f"{where}: Fn::Select takes [index, [values]], got {argument!r}")
        index, items = self._resolve(argument[0], where), self._resolve(argument[1], where)
        try:
            return items[int(index)]
        except (IndexError, ValueError, TypeError) as exc:
            raise TemplateError(f"{where}: Fn::Select index {index!r} out of range") from exc

    def _split(self, argument: Any, where: str) -> list[str]:
        if not (isinstance(argument, list) and len(argument) == 2):
            raise TemplateError(f"{where}: Fn::Split takes [delimiter, string], got {argument!r}")
        return str(self._resolve(argument[1], where)).split(str(argument[0]))

    def _if(self, argument: Any, where: str) -> Any:
        if not (isinstance(argument, list) and len(argument) == 3):
            raise TemplateError(f"{where}: Fn::If takes [condition, then, else], got {argument!r}")
        branch = argument[1] if self.condition(argument[0]) else argument[2]
        return self._resolve(branch, where)

    def _equals(self, argument: Any, where: str) -> bool:
        if not (isinstance(argument, list) and len(argument) == 2):
            raise TemplateError(f"{where}: Fn::Equals takes two values, got {argument!r}")
        left, right = (self._resolve(item, where) for item in argument)
        return str(left) == str(right)

    def _not(self, argument: Any, where: str) -> bool:
        if not (isinstance(argument, list) and len(argument) == 1):
            raise TemplateError(f"{where}: Fn::Not takes [condition], got {argument!r}")
        return not self._truth(argument[0], where)

    def _and(self, argument: Any, where: str) -> bool:
        return all(self._truth(item, where) for item in argument)

    def _or(self, argument: Any, where: str) -> bool:
        return any(self._truth(item, where) for item in argument)

    def _truth(self, item: Any, where: str) -> bool:
        value = self._resolve(item, where)
        return value if isinstance(value, bool) else str(value).lower() == "true"

    def _condition(self, name: Any, where: str) -> bool:
        return self.condition(str(name))

    def _find_in_map(self, argument: Any, where: str) -> Any:
        if not (isinstance(argument, list) and len(argument) >= 3):
            raise TemplateError(f"{where}: Fn::FindInMap takes [map, key, key], got {argument!r}")
        name, first, second = (self._resolve(item, where) for item in argument[:3])
        try:
            return self._resolve(self._template["Mappings"][name][first][second], where)
        except (KeyError, TypeError):
            if len(argument) == 4 and isinstance(argument[3], dict) and "DefaultValue" in argument[3]:
                return self._resolve(argument[3]["DefaultValue"], where)
            raise TemplateError(f"{where}: no mapping {name}.{first}.{second}") from None

    def _base64(self, argument: Any, where: str) -> str:
        return base64.b64encode(str(self._resolve(argument, where)).encode()).decode()

    def _get_azs(self, argument: Any, where: str) -> list[str]:
        region = self._resolve(argument, where) or self.pseudo["AWS::Region"]
        return [f"{region}{zone}" for zone in "abc"]

    _FUNCTIONS: ClassVar[dict[str, Callable[[Resolver, Any, str], Any]]] = {
        "Ref": _ref,
        "Fn::GetAtt": _get_att,
        "Fn::Sub": _sub,
        "Fn::Join": _join,
        "Fn::Select": _select,
        "Fn::Split": _split,
        "Fn::If": _if,
        "Fn::Equals": _equals,
        "Fn::Not": _not,
        "Fn::And": _and,
        "Fn::Or": _or,
        "Condition": _condition,
        "Fn::FindInMap": _find_in_map,
        "Fn::Base64": _base64,
        "Fn::GetAZs": _get_azs,
    }
