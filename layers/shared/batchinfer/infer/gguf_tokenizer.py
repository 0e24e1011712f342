"""Derive a Hugging Face `tokenizer.json` and `tokenizer_config.json` from a GGUF file.

The KServe v2 backend needs the model's tokenizer and chat template to serve chat requests. Hugging
Face model folders ship both files; a GGUF holds the same data in its metadata (`tokenizer.ggml.*`,
`tokenizer.chat_template`). This tool rebuilds them, for byte-level BPE vocabularies
(`tokenizer.ggml.model` "gpt2") whose pre-tokenizer is one of `_PRE_TOKENIZERS`:

    python -m batchinfer.infer.gguf_tokenizer model.gguf out_dir/   # writes the two files

The rebuilt tokenizer encodes text into the same ids as llama.cpp does for that GGUF (tested on
SmolLM2). It reads the GGUF with the `gguf` package (llama.cpp's reader, a tool dependency in
requirements/dev.txt, not needed on Lambda).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["tokenizer_files_from_gguf"]

# llama.cpp token types (llama_token_type): 3 = CONTROL (special tokens such as <|im_start|>).
_CONTROL = 3
# tokenizer.ggml.pre -> does it first split every digit apart (llama.cpp: the "\p{N}" rule of smollm)?
_PRE_TOKENIZERS = {"smollm": True, "gpt-2": False}


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"the GGUF has no {key}")
    return field.contents()


def tokenizer_files_from_gguf(gguf_path: str | Path) -> tuple[str, str]:
    """(tokenizer.json text, tokenizer_config.json text) for the GGUF at `gguf_path`.

    tokenizer.json: BPE over the GGUF's tokens and merges, digits split apart when the pre-tokenizer
    asks for it, byte-level pre-tokenization with GPT-2's split rule, byte-level decoding, and every
    CONTROL token registered as a special token. tokenizer_config.json: `chat_template`, `bos_token`
    and `eos_token` from the metadata.

    Raises `ValueError` for a vocabulary this tool does not rebuild, `ImportError` without `gguf`.
    """
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = GGUFReader(str(gguf_path))
    kind, pre = _field(reader, "tokenizer.ggml.model"), _field(reader, "tokenizer.ggml.pre")
    if kind != "gpt2" or pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"unsupported tokenizer {kind!r} with pre-tokenizer {pre!r}; supported: gpt2 with "
            f"{', '.join(_PRE_TOKENIZERS)}"
        )
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    types: list[int] = _field(reader, "tokenizer.ggml.token_type")

    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    # ByteLevel's own regex is GPT-2's split rule, which llama.cpp applies for these pre-tokenizers.
    steps: list[Any] = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if _PRE_TOKENIZERS[pre]:
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, types, strict=True)
            if kind == _CONTROL
        ]
    )

    def token(key: str) -> str | None:
        field = reader.fields.get(key)
        return tokens[int(field.contents())] if field is not None else None

    config = {
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "add_bos_token": bool(reader.fields["tokenizer.ggml.add_bos_token"].contents())
        if "tokenizer.ggml.add_bos_token" in reader.fields
        else False,
    }
    return tokenizer.to_str(), json.dumps(config, ensure_ascii=False, indent=2)


def main(argv: list[str] | None = None) -> int:
    """`python -m batchinfer.infer.gguf_tokenizer MODEL.gguf OUT_DIR`: write the two files into OUT_DIR."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(args[1])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_json, config_json = tokenizer_files_from_gguf(args[0])
    (out / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (out / "tokenizer_config.json").write_text(config_json, encoding="utf-8")
    print(f"wrote {out / 'tokenizer.json'} and {out / 'tokenizer_config.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
