"""Model backends and the registry that maps a request's `model` to one.

    registry = load_registry()                 # batchinfer/backends/models.yaml, or load_registry(path)
    if "smollm2-135m-instruct" in registry:
        completion = await registry.backend("smollm2-135m-instruct").chat_completion(body)

Modules, each importing only those above it: `base` (protocols, errors, request checks), `config`
(the registry's options), `http` (POST and status mapping of the remote backends) and `llama_engine`
(continuous batching on llama.cpp), the backends (`llama_cpp`, `openai_compat`, `kserve_v2`,
`bedrock`), `registry`; beside them `limiter` (the
worker's concurrency window) and `chaos` (injected faults). Backend modules are imported only when
a model needing them is built, so a Lambda without llama-cpp-python installed can use the registry.
"""

from batchinfer.backends.base import (
    BackendError,
    BackendNotImplemented,
    ChatBackend,
    ModelNotFound,
    RegistryError,
    TokenBackend,
)
from batchinfer.backends.config import (
    BedrockConfig,
    KServeV2Config,
    LlamaCppConfig,
    ModelConfig,
    OpenAICompatConfig,
)
from batchinfer.backends.registry import ModelRegistry, load_registry

__all__ = [
    "BackendError",
    "BackendNotImplemented",
    "BedrockConfig",
    "ChatBackend",
    "KServeV2Config",
    "LlamaCppConfig",
    "ModelConfig",
    "ModelNotFound",
    "ModelRegistry",
    "OpenAICompatConfig",
    "RegistryError",
    "TokenBackend",
    "load_registry",
]
