"""What each body of tests/fixtures/cases/16-17-token-infer gets from
POST /v2/models/smollm2-135m-instruct/infer
with the shipped registry (vocabulary 49152, prompt limit 2047): None for a 200, else the 400's
(param, message)."""

from __future__ import annotations

from support.cases import CASES as ALL_CASES

CASES = ALL_CASES / "16-17-token-infer"
_UINT32 = "must be a UINT32 token id, an integer in [0, 4294967295]"
_VOCAB = "must be a token id of the model's vocabulary, an integer in [0, 49152)"
_DATATYPE = 'inputs[0].datatype must be "UINT32" (token ids)'
_COUNT = "inputs[0].shape[1] must equal the number of token ids in inputs[0].data"

CASE_ERRORS: dict[str, tuple[str, str] | None] = {
    "ok-boundary-last-id.json": None,
    "flat-shape.json": None,
    "datatype-fp32.json": ("inputs[0].datatype", f'{_DATATYPE}, got string "FP32"'),
    "datatype-int64.json": ("inputs[0].datatype", f'{_DATATYPE}, got string "INT64"'),
    "datatype-lowercase.json": ("inputs[0].datatype", f'{_DATATYPE}, got string "uint32"'),
    "empty-data.json": (
        "inputs[0].data",
        "inputs[0].data must hold n token ids with n in (0, 2047] (the least of 1048576, max_input_tokens "
        "2048, max_seq_len - 1 = 2047, max_position_embeddings 8192), got 0",
    ),
    "id-2pow32.json": ("inputs[0].data[1]", f"inputs[0].data[1] {_UINT32}, got integer 4294967296"),
    "id-bool.json": ("inputs[0].data[1]", f"inputs[0].data[1] {_UINT32}, got boolean true"),
    "id-equal-vocab.json": ("inputs[0].data[1]", f"inputs[0].data[1] {_VOCAB}, got integer 49152"),
    "id-float-integral.json": ("inputs[0].data[1]", f"inputs[0].data[1] {_UINT32}, got number 3.0"),
    "id-float.json": ("inputs[0].data[1]", f"inputs[0].data[1] {_UINT32}, got number 3.5"),
    "id-negative.json": ("inputs[0].data[1]", f"inputs[0].data[1] {_UINT32}, got integer -1"),
    "id-null.json": ("inputs[0].data[1]", f"inputs[0].data[1] {_UINT32}, got null"),
    "id-string.json": ("inputs[0].data[1]", f'inputs[0].data[1] {_UINT32}, got string "7"'),
    "id-uint32-max.json": ("inputs[0].data[1]", f"inputs[0].data[1] {_VOCAB}, got integer 4294967295"),
    "input-name-misspelled.json": (
        "inputs[0].name",
        'inputs[0].name must be "input0" (MindIE\'s one token input), got string "input_id"',
    ),
    "no-outputs.json": (
        "outputs",
        "outputs is required: it must be an array of exactly 1 output, as many as inputs",
    ),
    "shape-empty.json": (
        "inputs[0].shape",
        "inputs[0].shape must be [n] or [1, n], where n is the number of token ids in data, "
        "got [] (0 dimensions)",
    ),
    "shape-negative-dim.json": (
        "inputs[0].shape[1]",
        "inputs[0].shape[1] must be a positive integer, the number of token ids in inputs[0].data (3), "
        "got -1",
    ),
    "shape-too-big.json": ("inputs[0].shape[1]", f"{_COUNT}: 4 expected by shape [1, 4], 3 given"),
    "shape-too-small.json": ("inputs[0].shape[1]", f"{_COUNT}: 2 expected by shape [1, 2], 3 given"),
    "two-inputs.json": ("inputs", "inputs must be an array of exactly 1 input tensor, got 2 elements"),
}
# Only these need the model (its vocabulary): as batch lines they pass validation and fail per line.
NEEDS_THE_MODEL = frozenset({"id-equal-vocab.json", "id-uint32-max.json"})
