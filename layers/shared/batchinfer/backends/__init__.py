"""Model backends and the registry that maps a request's `model` to one.

    registry = load_registry()                 # batchinfer/backends/models.yaml, or load_registry(path)
    if "smollm2-135m-instruct" in registry:
        completion = await registry.backend("smollm2-135m-instruct").chat_completion(body)

Backend modules (llama_cpp, openai_compat) are imported only when a model needing them is built,
so a Lambda without llama-cpp-python installed can still use the registry.
"""

from batchinfer.backends.base import BackendError, ChatBackend
from batchinfer.backends.registry import (
    BackendNotImplemented,
    BedrockConfig,
    KServeV2Config,
    LlamaCppConfig,
    ModelConfig,
    ModelNotFound,
    ModelRegistry,
    OpenAICompatConfig,
    RegistryError,
    load_registry,
)

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
    "load_registry",
]
