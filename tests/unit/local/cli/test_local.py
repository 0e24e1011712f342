"""`batchinfer local`'s function logs, labelled with their function."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

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


class _Stack:
    """What `_run_local` uses of a LocalStack, and whether it was stopped."""

    base_url, api_key, api_key_generated, iam_enforced = "http://127.0.0.1:1", "local", False, False
    moto_endpoint, environment, buckets = "http://127.0.0.1:2", {"TABLE_NAME": "t"}, {"DataBucket": "b"}
    resolver, region = None, "us-east-1"
    stopped = False

    def stop(self) -> None:
        self.stopped = True


def test_sigint_stops_the_stack_even_when_started_with_sigint_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given `batchinfer local` started where SIGINT is ignored (a script's `&`, a test runner's worker)
    from batchinfer_local.cli import local

    monkeypatch.setattr(local, "start", lambda stack, port: None)
    monkeypatch.setenv("BATCHINFER_LOCAL_STATE", str(tmp_path / "local.json"))
    stack, handlers = _Stack(), {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctrl_c = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    ctrl_c.start()
    try:
        # When Ctrl-C's signal comes, Then it stops the stack and exits 0, its state file gone
        assert (local._run_local(stack, 0), stack.stopped) == (0, True)
    finally:
        ctrl_c.cancel()
        ctrl_c.join()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert not (tmp_path / "local.json").exists()
