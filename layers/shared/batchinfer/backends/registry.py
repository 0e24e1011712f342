"""The model registry: which model names a deployment serves, and the backend that answers each.

The registry is a YAML file (default: `batchinfer/backends/models.yaml`, overridable with the
MODEL_REGISTRY setting) of the shape::

    models:
      <name>:                      # the `model` of a request body
        backend: llama_cpp | openai | kserve_v2 | bedrock
        <backend options>          # see the *Config classes of `batchinfer.backends.config`

It is validated with pydantic when loaded, and a backend is constructed on first use only (a
llama.cpp model costs memory and load time that a Lambda serving other models should not pay); its
module is imported then too, so a Lambda without llama-cpp-python installed can use the registry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from batchinfer.backends.base import ChatBackend, ModelNotFound, RegistryError
from batchinfer.backends.config import BACKEND_TAGS, RETIRED_OPTIONS, ModelConfig
from batchinfer.core.settings import DEFAULT_REGISTRY
from batchinfer.wire.messages import loc_path

__all__ = ["ModelRegistry", "load_registry"]


def _llama_cpp() -> Callable[[str, Any], ChatBackend]:
    from batchinfer.backends.llama_cpp import LlamaCppBackend

    return LlamaCppBackend


def _openai() -> Callable[[str, Any], ChatBackend]:
    from batchinfer.backends.openai_compat import OpenAICompatBackend

    return OpenAICompatBackend


def _kserve_v2() -> Callable[[str, Any], ChatBackend]:
    from batchinfer.backends.kserve_v2 import KServeV2Backend

    return KServeV2Backend


def _bedrock() -> Callable[[str, Any], ChatBackend]:
    from batchinfer.backends.bedrock import BedrockBackend

    return BedrockBackend


def _llama_embed() -> Callable[[str, Any], ChatBackend]:
    from batchinfer.backends.llama_embed import LlamaEmbedBackend

    return LlamaEmbedBackend  # type: ignore[return-value]  # an embeddings backend: no chat


# A config's `backend` tag -> its backend class, imported when the first model of that kind is built.
_BACKENDS: dict[str, Callable[[], Callable[[str, Any], ChatBackend]]] = {
    "llama_cpp": _llama_cpp,
    "openai": _openai,
    "kserve_v2": _kserve_v2,
    "bedrock": _bedrock,
    "llama_embed": _llama_embed,
}


def build_backend(name: str, config: ModelConfig) -> ChatBackend:
    """The backend answering for registry name `name` with `config` (a model file loads on first request).

    Raises `RegistryError` for what only construction can check: a GGUF file that cannot be found,
    an unset `api_key_env`, a tokenizer file that does not exist.
    """
    try:
        return _BACKENDS[config.backend]()(name, config)
    except FileNotFoundError as exc:
        raise RegistryError(f"model '{name}': {exc}") from None


class _RegistryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: dict[Annotated[str, StringConstraints(min_length=1)], ModelConfig]


def _problem(error: Mapping[str, Any]) -> str:
    loc = list(error["loc"])
    # pydantic puts the union tag into the location (models.x.llama_cpp.n_ctx); readers want models.x.n_ctx.
    tag = loc.pop(2) if len(loc) >= 3 and loc[0] == "models" and loc[2] in BACKEND_TAGS else None
    if loc and loc[-1] == "[key]":  # a bad model name: pydantic reports it at models.<name>.[key]
        loc = ["models", "(model name)"]
    where = loc_path(loc) or "(top level)"
    if error["type"] == "union_tag_not_found":
        return f"{where}: 'backend' is required, one of {', '.join(sorted(BACKEND_TAGS))}"
    if error["type"] == "extra_forbidden" and (retired := RETIRED_OPTIONS.get((tag or "", str(loc[-1])))):
        return f"{where}: {retired}"
    text = f"{where}: {error['msg'].removeprefix('Value error, ')}"
    # Never echo a secret back into logs.
    shown = error["type"] not in {"missing", "extra_forbidden"} and loc[-1:] != ["api_key"]
    if shown and not isinstance(error.get("input"), dict):
        text += f" (got {error.get('input')!r})"
    return text


class ModelRegistry:
    """The validated registry: model names and their lazily built backends (thread-safe)."""

    def __init__(self, models: Mapping[str, ModelConfig], source: str = "<memory>") -> None:
        self._models = dict(models)
        self.source = source
        self._backends: dict[str, ChatBackend] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_dict(cls, data: Any, source: str = "<memory>") -> ModelRegistry:
        """Validate a parsed registry document (`{"models": {...}}`).

        Raises `RegistryError` listing every problem, each as `location: message (got value)`.
        """
        if data is None:
            raise RegistryError(f"invalid model registry {source}: the file is empty")
        if not isinstance(data, Mapping):
            raise RegistryError(
                f"invalid model registry {source}: expected a mapping with a 'models' key, "
                f"got {type(data).__name__}"
            )
        try:
            parsed = _RegistryFile.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(_problem(err) for err in exc.errors(include_url=False))
            raise RegistryError(f"invalid model registry {source}: {problems}") from None
        return cls(parsed.models, source)

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def names(self) -> list[str]:
        """The model names, in file order."""
        return list(self._models)

    def config(self, name: str) -> ModelConfig:
        """The validated options of model `name`; raises `ModelNotFound` for an unknown name."""
        try:
            return self._models[name]
        except KeyError:
            raise ModelNotFound(name) from None

    def in_process(self, name: str) -> bool:
        """Whether model `name` runs inside the worker's process (an embedded engine) rather than on a
        server of its own; raises `ModelNotFound` for an unknown name."""
        return self.config(name).in_process

    def serves(self, name: str) -> frozenset[str]:
        """The batch endpoint templates model `name`'s backend declares (its class's `serves_for(config)`
        where it has one, else its `serves`), without building the backend. Raises `ModelNotFound` for an
        unknown name."""
        config = self.config(name)
        kind = _BACKENDS[config.backend]()
        serves_for = getattr(kind, "serves_for", None)
        return serves_for(config) if serves_for is not None else kind.serves  # type: ignore[attr-defined]

    def backend(self, name: str) -> ChatBackend:
        """The backend serving model `name`, built on first call and reused for the process's life.

        Raises `ModelNotFound` for a name the registry does not list and `RegistryError` for options
        only checkable at build time (see `build_backend`).
        """
        backend = self._backends.get(name)
        if backend is not None:
            return backend
        config = self.config(name)
        with self._lock:
            backend = self._backends.get(name)
            if backend is None:
                backend = build_backend(name, config)
                self._backends[name] = backend
            return backend


@cache
def _load_cached(path: Path) -> ModelRegistry:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RegistryError(f"cannot read model registry {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RegistryError(f"invalid model registry {path}: not valid YAML: {exc}") from None
    return ModelRegistry.from_dict(data, source=str(path))


def load_registry(path: Path | str | None = None) -> ModelRegistry:
    """The registry in YAML file `path` (default: the packaged `batchinfer/backends/models.yaml`).

    Cached per resolved path, so every caller in a process shares one registry and hence one
    backend per model. Raises `RegistryError` when the file is unreadable, not YAML, or invalid.
    """
    return _load_cached(Path(path if path is not None else DEFAULT_REGISTRY).resolve())


load_registry.cache_clear = _load_cached.cache_clear  # type: ignore[attr-defined]
