"""The local tools stay readable: no function over 60 lines (def line to last line), no module over 500."""

from __future__ import annotations

import ast
from pathlib import Path

import batchinfer_local

ROOT = Path(batchinfer_local.__file__).parent
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500


def test_no_function_over_60_lines_and_no_module_over_500() -> None:
    too_long = []
    for path in sorted(ROOT.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT)
        if source.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{name}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert too_long == []
