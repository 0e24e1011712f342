"""The /v2/models/{model}/infer endpoint's body checks of batch lines, against the token request
contract (tests/fixtures/cases/16-17-token-infer); /v1/chat/completions bodies are in
tests/unit/validation/test_file.py."""

from __future__ import annotations

import json

import pytest

from batchinfer.endpoints.infer import check_infer_body
from batchinfer.wire.line_errors import LineError
from support.token_cases import CASE_ERRORS, CASES, NEEDS_THE_MODEL


@pytest.mark.parametrize("name", sorted(CASE_ERRORS))
def test_case_file_as_a_batch_line(name: str) -> None:
    case = json.loads((CASES / name).read_text())
    expected = CASE_ERRORS[name]

    errors = check_infer_body(case, 7)

    if expected is None or name in NEEDS_THE_MODEL:
        assert errors == []
    else:
        param, message = expected
        if name == "empty-data.json":  # without a model only the 1M-token cap is known
            message = "inputs[0].data must hold n token ids with n in (0, 1048576], got 0"
        code = "missing_required_parameter" if name == "no-outputs.json" else "invalid_parameter"
        assert errors == [
            LineError(code=code, message=f"Line 7: body: {message}", param=f"body.{param}", line=7)
        ]
