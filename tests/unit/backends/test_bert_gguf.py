"""The BERT safetensors -> GGUF converter on a tiny made-up model: llama.cpp's names and types, the
vocabulary in phantom-space form, the pooling of `1_Pooling/config.json`, one file per version."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np

from batchinfer.backends.bert_gguf import bert_gguf, pooling_type

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cat", "##s"]


def tiny_bert(directory: Path, hidden: int = 8) -> Path:
    """A one-layer BERT of `hidden` dimensions with made-up weights, as sentence-transformers ships one."""
    shapes = {
        "embeddings.word_embeddings.weight": [len(VOCAB), hidden],
        "embeddings.position_embeddings.weight": [16, hidden],
        "embeddings.token_type_embeddings.weight": [2, hidden],
        "embeddings.LayerNorm.weight": [hidden],
        "embeddings.LayerNorm.bias": [hidden],
        "embeddings.position_ids": [1, 16],
        "pooler.dense.weight": [hidden, hidden],
    }
    prefix = "encoder.layer.0."
    for name, rows in (
        ("attention.self.query", hidden),
        ("attention.self.key", hidden),
        ("attention.self.value", hidden),
        ("attention.output.dense", hidden),
        ("intermediate.dense", 4 * hidden),
    ):
        shapes[f"{prefix}{name}.weight"], shapes[f"{prefix}{name}.bias"] = [rows, hidden], [rows]
    shapes[f"{prefix}output.dense.weight"], shapes[f"{prefix}output.dense.bias"] = (
        [hidden, 4 * hidden],
        [hidden],
    )
    for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
        shapes[f"{prefix}{norm}.weight"] = shapes[f"{prefix}{norm}.bias"] = [hidden]
    header, blobs, offset = {}, [], 0
    for name, shape in shapes.items():
        dtype = np.int64 if name.endswith("position_ids") else np.float32
        blob = np.arange(int(np.prod(shape)), dtype=dtype).tobytes()
        header[name] = {
            "dtype": "I64" if dtype is np.int64 else "F32",
            "shape": shape,
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    config = {"max_position_embeddings": 16, "hidden_size": hidden, "intermediate_size": 4 * hidden}
    config |= {
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "layer_norm_eps": 1e-12,
        "type_vocab_size": 2,
    }
    (directory / "config.json").write_text(json.dumps(config))
    added = [{"id": i, "content": token, "special": True} for i, token in enumerate(VOCAB[:5])]
    tokenizer = {
        "model": {"type": "WordPiece", "vocab": {t: i for i, t in enumerate(VOCAB)}},
        "added_tokens": added,
    }
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    return directory


def test_the_gguf_has_llama_cpps_bert_names_types_and_vocabulary(tmp_path: Path) -> None:
    # Given a tiny BERT
    (tmp_path / "tiny-bert").mkdir()
    model = tiny_bert(tmp_path / "tiny-bert", hidden=8)

    # When
    path = bert_gguf(model, tmp_path / "cache")

    # Then
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t.tensor_type.name for t in reader.tensors}
    assert tensors["token_embd.weight"] == "F32"
    assert tensors["blk.0.attn_q.weight"] == tensors["blk.0.ffn_down.weight"] == "F16"
    assert tensors["blk.0.attn_output_norm.bias"] == tensors["blk.0.layer_output_norm.weight"] == "F32"
    assert not [name for name in tensors if "pooler" in name or "position_ids" in name]
    assert len(tensors) == 5 + 16
    fields = reader.fields
    tokens = [
        bytes(fields["tokenizer.ggml.tokens"].parts[i]).decode() for i in fields["tokenizer.ggml.tokens"].data
    ]
    assert tokens == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u2581cat", "s"]
    assert int(fields["bert.pooling_type"].parts[-1][0]) == gguf.PoolingType.MEAN
    assert path.name == "tiny-bert-" + str((model / "model.safetensors").stat().st_size) + "-v1.gguf"
    assert bert_gguf(model, tmp_path / "cache") == path and len(list((tmp_path / "cache").iterdir())) == 1


def test_pooling_is_the_models_own(tmp_path: Path) -> None:
    # Given / When / Then
    assert pooling_type(tmp_path) == "mean"
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    assert pooling_type(tmp_path) == "cls"
