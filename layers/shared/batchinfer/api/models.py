"""`/v1/models`: the models this deployment serves, from the model registry (OpenAI's Models API).

https://platform.openai.com/docs/api-reference/models
"""

from __future__ import annotations

from pathlib import Path as FilePath
from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Path

from batchinfer.api.errors import NotFound, documented
from batchinfer.backends.registry import ModelRegistry, load_registry
from batchinfer.core.settings import get_settings
from batchinfer.endpoints.registry import ENDPOINTS
from batchinfer.wire.messages import unknown_model
from batchinfer.wire.openai import Model, ModelList

router = Router()
ModelName = Annotated[str, Path(min_length=1, max_length=256)]


def _models(registry: ModelRegistry) -> list[Model]:
    # `created`: when the registry file was written (a model has no date of its own here).
    source = FilePath(registry.source)
    created = int(source.stat().st_mtime) if source.is_file() else 0
    return [
        Model(id=name, created=created, owned_by=registry.config(name).backend, endpoints=_endpoints(serves))
        for name in registry.names()
        for serves in [registry.serves(name)]  # read once per model, not once per endpoint
    ]


def _endpoints(serves: frozenset[str]) -> list[str]:
    """The endpoint templates a backend declaring `serves` answers, in the registry's order."""
    return [template for template, endpoint in ENDPOINTS.items() if endpoint.served_by(serves)]


@router.get("/v1/models", responses=documented(None))
def list_models() -> ModelList:
    """Every model a batch line (`body.model`) or `/v2/models/{model}/infer` may name."""
    return ModelList(data=_models(load_registry(get_settings().model_registry)))


@router.get("/v1/models/<model>", responses=documented(None, 404))
def retrieve_model(model: ModelName) -> Model:
    """One model of the registry; 404 `model_not_found` (naming the closest name) for any other."""
    registry = load_registry(get_settings().model_registry)
    for found in _models(registry):
        if found.id == model:
            return found
    message = unknown_model(model, registry.names())
    raise NotFound(message[0].upper() + message[1:], code="model_not_found", param="model")
