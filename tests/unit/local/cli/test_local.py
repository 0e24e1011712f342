"""`batchinfer local`'s function logs, labelled with their function."""

from __future__ import annotations

import pytest

from batchinfer_local.cli.local import show_function_logs


def test_function_log_lines_are_labelled_with_their_function(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    functions = logging.getLogger("batchinfer_local.function")
    before = functions.handlers[:]
    with show_function_logs(logging.INFO):
        logging.getLogger("batchinfer_local.function.ShardWorkerFunction").warning("a plain line")
        logging.getLogger("batchinfer_local.function.ApiFunction").info('{"level": "INFO"}')
        logging.getLogger("batchinfer_local.function.ApiFunction").debug("below the level")
    assert functions.handlers == before  # nothing left behind
    assert capsys.readouterr().out == '[ShardWorkerFunction] a plain line\n[ApiFunction] {"level": "INFO"}\n'
