"""A function's execution environments (`EnvironmentPool`): real processes, Lambda's rules.

The handlers are written to tmp_path; no moto is involved (the pool knows nothing of AWS).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchinfer_local.environments import EnvironmentPool
from batchinfer_local.functions import FunctionSpec
from batchinfer_local.runtime import Activity, InvocationError, Throttled

pytestmark = pytest.mark.timeout(120)

HANDLER = """\
import os
import sys
import threading
import time

import batchinfer.core.chaos as chaos

STARTED = time.monotonic()
BARRIER = {}


def handler(event, context):
    action = event.get("action")
    if action == "raise":
        raise ValueError("asked to raise")
    if action == "exit":
        os._exit(3)
    if action == "sleep":
        time.sleep(event["seconds"])
    if action == "unserializable":
        return object()
    if action == "chaos":
        chaos.injected["crash_before_commit"] += 1
    if action == "halves":  # one line in two writes, as print() writes a text and its newline
        sys.stdout.write(event["line"])
        sys.stdout.flush()
        time.sleep(event["seconds"])
        sys.stdout.write("\\n")
        sys.stdout.flush()
    if action == "log":
        print('{"level":"ERROR","message":"from the handler"}', flush=True)
        print("plain line", file=sys.stderr, flush=True)
    return {"pid": os.getpid(), "env": {k: os.environ.get(k) for k in ("FOO", "BAR")},
            "remaining_ms": context.get_remaining_time_in_millis(), "request_id": context.aws_request_id,
            "function_name": context.function_name, "cpus": sorted(os.sched_getaffinity(0)),
            "started": STARTED, "event": event}
"""


def spec(path: Path, **overrides: object) -> FunctionSpec:
    values: dict[str, object] = {
        "logical_id": "Fn",
        "function_name": "stack-Fn",
        "function_arn": "arn:aws:lambda:us-east-1:123456789012:function:stack-Fn",
        "handler_file": path,
        "handler_name": "handler",
        "timeout": 2,
    }
    return FunctionSpec(**{**values, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def handler_file(tmp_path: Path) -> Path:
    path = tmp_path / "app.py"
    path.write_text(HANDLER)
    return path


@pytest.fixture
def pool(handler_file: Path) -> Iterator[EnvironmentPool]:
    made = EnvironmentPool(
        spec(handler_file), {"PATH": os.environ["PATH"], "FOO": "foo"}, Activity(), limit=3
    )
    yield made
    made.close()


def test_an_invocation_gets_a_fresh_json_copy_its_own_context_and_only_the_given_variables(
    pool: EnvironmentPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BAR", "set in this process only")
    first = pool.invoke({"n": (1, 2)})
    second = pool.invoke({"n": 3})
    assert first["event"] == {"n": [1, 2]}
    assert first["env"] == {"FOO": "foo", "BAR": None}
    assert first["function_name"] == "stack-Fn"
    assert 1500 < first["remaining_ms"] <= 2000  # the function's Timeout, 2 s
    assert first["request_id"] != second["request_id"]
    assert first["pid"] == second["pid"] != os.getpid()  # one warm environment, reused
    assert first["started"] == second["started"]  # init ran once in it
    with pytest.raises(TypeError):
        pool.invoke({"x": object()})
    assert pool.pool_stats().invocations == 2


def test_errors_are_lambdas_and_leave_the_environment_or_end_it(pool: EnvironmentPool) -> None:
    warm = pool.invoke({})["pid"]
    with pytest.raises(InvocationError) as raised:
        pool.invoke({"action": "raise"})
    assert (raised.value.error["errorType"], raised.value.error["errorMessage"]) == (
        "ValueError",
        "asked to raise",
    )
    assert any("asked to raise" in line for line in raised.value.error["stackTrace"])
    with pytest.raises(InvocationError) as marshal:
        pool.invoke({"action": "unserializable"})
    assert marshal.value.error["errorType"] == "Runtime.MarshalError"
    assert pool.invoke({})["pid"] == warm  # a handler's error keeps its environment
    with pytest.raises(InvocationError) as exited:
        pool.invoke({"action": "exit"})
    assert exited.value.error["errorType"] == "Runtime.ExitError"
    assert pool.invoke({})["pid"] != warm  # a new environment (cold)


def test_a_timeout_kills_its_environment(pool: EnvironmentPool) -> None:
    warm = pool.invoke({})["pid"]
    started = time.monotonic()
    with pytest.raises(InvocationError) as timed_out:
        pool.invoke({"action": "sleep", "seconds": 30})
    assert timed_out.value.error == {
        "errorType": "Sandbox.Timedout",
        "errorMessage": "Task timed out after 2.00 seconds",
    }
    assert 2 <= time.monotonic() - started < 10
    assert pool.invoke({})["pid"] != warm  # the next invocation is cold
    with pytest.raises(ProcessLookupError):  # and the process that timed out is gone (reaped on that spawn)
        os.kill(warm, 0)


def test_concurrent_invocations_get_environments_of_their_own_up_to_the_limit(pool: EnvironmentPool) -> None:
    results: list[dict[str, object]] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            results.append(pool.invoke({"action": "sleep", "seconds": 1}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(5)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    with pytest.raises(Throttled):  # all 3 environments are busy
        pool.invoke({}, block=False)
    for thread in threads:
        thread.join()
    stats = pool.pool_stats()
    assert errors == []
    assert (stats.peak, stats.environments, stats.limit) == (3, 3, 3)
    assert len({result["pid"] for result in results}) == 3
    assert len({result["started"] for result in results}) == 3  # each ran its own init, as in Lambda


def test_configure_reaches_every_environment_and_stats_come_back(pool: EnvironmentPool) -> None:
    pool.invoke({"action": "chaos"})
    assert pool.stats() == {"chaos:crash_before_commit": 1}
    pool.configure({"FOO": "changed", "BAR": "new"}, call=["batchinfer.core.chaos.reset"])
    after = pool.invoke({"action": "chaos"})
    assert after["env"] == {"FOO": "changed", "BAR": "new"}
    assert pool.stats() == {"chaos:crash_before_commit": 2}  # the reset counter starts again, not negative
    pool.configure(
        unset=["BAR"], call=["json.tool.main", "batchinfer.core.settings.get_settings.cache_clear"]
    )
    assert pool.invoke({})["env"] == {"FOO": "changed", "BAR": None}
    pool.reset_stats()
    assert pool.stats() == {}


def test_a_failed_init_fails_the_invocation_and_is_tried_again(tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    path.write_text("raise RuntimeError('broken at import')\n")
    broken = EnvironmentPool(spec(path), {"PATH": os.environ["PATH"]}, Activity(), limit=1)
    try:
        with pytest.raises(InvocationError) as failed:
            broken.invoke({})
        assert (failed.value.error["errorType"], failed.value.error["errorMessage"]) == (
            "Runtime.ImportModuleError",
            "broken at import",
        )
        path.write_text(HANDLER)
        assert broken.invoke({})["env"]["FOO"] is None
    finally:
        broken.close()


def test_an_environment_starting_beside_others_gets_one_cpu(handler_file: Path) -> None:
    usable = sorted(os.sched_getaffinity(0))
    pinned = EnvironmentPool(
        spec(handler_file), {"PATH": os.environ["PATH"]}, Activity(), limit=3, share_cpus=True
    )
    try:
        results: list[dict[str, object]] = []

        def call(seconds: float) -> None:
            results.append(pinned.invoke({"action": "sleep", "seconds": seconds}))

        first = threading.Thread(target=call, args=(1.5,))
        first.start()
        time.sleep(0.5)  # the first environment started alone
        second = threading.Thread(target=call, args=(0.1,))
        second.start()
        for thread in (first, second):
            thread.join()
        assert [result["cpus"] for result in results] == [[usable[1 % len(usable)]], usable]
    finally:
        pinned.close()


def test_the_functions_log_lines_are_forwarded_at_their_level(
    pool: EnvironmentPool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="batchinfer_local.function"):
        pool.invoke({"action": "log"})
        deadline = time.monotonic() + 10
        while len([r for r in caplog.records if r.name == "batchinfer_local.function.Fn"]) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    lines = [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == "batchinfer_local.function.Fn"
    ]
    # stdout and stderr are read apart: their lines' relative order is not kept
    assert sorted(lines) == [
        ("ERROR", '{"level":"ERROR","message":"from the handler"}'),
        ("WARNING", "plain line"),
    ]


def test_environments_writing_at_once_keep_their_lines_whole(
    pool: EnvironmentPool, caplog: pytest.LogCaptureFixture
) -> None:
    # Each environment logs to its own stream (as on Lambda): one environment's line never lands in the
    # middle of another's.
    calls = [
        {"action": "halves", "line": "first", "seconds": 1.0},
        {"action": "halves", "line": "second", "seconds": 0.2},
    ]
    with caplog.at_level(logging.INFO, logger="batchinfer_local.function"):
        threads = [threading.Thread(target=pool.invoke, args=(call,)) for call in calls]
        for thread in threads:
            thread.start()
            time.sleep(0.3)  # the first has written its half line when the second starts
        for thread in threads:
            thread.join()
        deadline = time.monotonic() + 5
        while len([r for r in caplog.records if r.name == "batchinfer_local.function.Fn"]) < 2:
            if time.monotonic() > deadline:
                break  # one shared stream would have made one line of both: "firstsecond"
            time.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if r.name == "batchinfer_local.function.Fn"]
    assert lines == ["second", "first"]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_every_functions_zygote_is_forked_by_the_one_zygote_server(handler_file: Path) -> None:
    from batchinfer_local.zygote_server import zygote_server

    # Given two functions' pools
    pools = [
        EnvironmentPool(
            spec(handler_file, logical_id=name),
            {"PATH": os.environ["PATH"], "FOO": name},
            Activity(),
            limit=1,
        )
        for name in ("Fn", "Other")
    ]
    try:
        # When each runs an invocation
        answers = [pool.invoke({}) for pool in pools]
        # Then each environment has its own function's variables, and its zygote is a child of the server
        zygotes = [_parent(answer["pid"]) for answer in answers]
        assert [answer["env"]["FOO"] for answer in answers] == ["Fn", "Other"]
        assert zygotes[0] != zygotes[1]
        assert [_parent(zygote) for zygote in zygotes] == [zygote_server().process.pid] * 2
    finally:
        for pool in pools:
            pool.close()
