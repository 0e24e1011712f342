"""Local stacks shared by configuration: the modules that run on the same configuration run on one stack.

A `LocalStack` is one per process (moto's state and `os.environ` are process-wide), so sharing means
one running stack at a time, reused while the tests that follow ask for the same `StackConfig`:
tests/conftest.py orders the tests so that one configuration's modules run one after another and
gives them one xdist group (one worker runs them all, building the stack once), and stops the stack
before a test that uses none (a per-test stack, in-process moto). A module's tests isolate
themselves on a shared stack by an account of their own (`new_account`) and their batch ids.

`SharedStacks.lease` hands a module the stack and leaves it idle for the next module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from batchinfer_local import LocalStack
from support.api_stack import HoldableUpstream, stack_with_upstream

# What caches the variables `lease` changes, in each function's environments.
SETTINGS_RESETS = ["batchinfer.core.settings.get_settings.cache_clear"]


@dataclass(frozen=True)
class StackConfig:
    """One configuration of the local stack: the arguments of `LocalStack` and its model registry.

    `name` is the configuration's xdist group and order key (one name, one configuration). `upstream`:
    the registry also serves `scripted-model` from a `HoldableUpstream` (`api_stack.write_registry`),
    else it is the default one. `heavy`: the modules run the model in several environments at once;
    every heavy configuration shares one xdist group, so that no two of them run at once on the
    machine's cores.
    """

    name: str
    upstream: bool = False
    parameter_overrides: dict[str, str] = field(default_factory=dict, hash=False, compare=True)
    function_environment: dict[str, str] = field(default_factory=dict, hash=False, compare=True)
    schedule_interval: float | None = None
    iam: bool | None = None
    heavy: bool = False

    @property
    def mark(self) -> pytest.MarkDecorator:
        """The module mark (`pytestmark`) that puts a module's tests on this configuration."""
        return pytest.mark.stack(self.name, heavy=self.heavy)

    def stack_args(self) -> dict[str, Any]:
        """`LocalStack`'s keyword arguments (but `port`: always a free one)."""
        return {
            "schedule_interval": self.schedule_interval,
            "parameter_overrides": self.parameter_overrides,
            "function_environment": self.function_environment,
            "iam": self.iam,
        }


@dataclass
class Running:
    """A started stack of `config` (and its upstream, for `upstream` configurations)."""

    config: StackConfig
    stack: LocalStack
    upstream: HoldableUpstream | None
    exits: ExitStack


class SharedStacks:
    """The process's one shared stack: started on demand by configuration, stopped by `close`."""

    def __init__(self) -> None:
        self._running: Running | None = None

    def use(self, config: StackConfig, tmp: Path) -> Running:
        """The running stack of `config`: the current one if it has that configuration, else a new one
        (the current one stopped first). `tmp`: a directory for an upstream's registry file."""
        if self._running is not None and self._running.config == config:
            return self._running
        self.close()
        exits = ExitStack()
        try:
            self._running = _start(config, tmp, exits)
        except BaseException:
            exits.close()
            raise
        return self._running

    def close(self) -> None:
        """Stop the running stack, if any (idempotent)."""
        running, self._running = self._running, None
        if running is not None:
            running.exits.close()

    @contextmanager
    def lease(
        self, config: StackConfig, tmp: Path, environment: dict[str, str] | None = None
    ) -> Iterator[Running]:
        """The stack of `config` for one module: its upstream re-armed (as a fresh one), `environment`
        set in every function over the configuration's own; at the end, held requests released, the
        stack idle and the variables as the configuration has them."""
        running = self.use(config, tmp)
        stack, environment = running.stack, dict(environment or {})
        if running.upstream is not None:
            running.upstream.rearm()
        if environment:
            stack.configure_functions(environment, call=SETTINGS_RESETS)
        try:
            yield running
        finally:
            if running.upstream is not None:
                running.upstream.release()  # held requests answer now, so no worker outlives the module
            with contextlib.suppress(TimeoutError):
                stack.wait_idle(60)
            if environment:
                own = config.function_environment
                stack.configure_functions(
                    {name: own[name] for name in environment if name in own},
                    unset=[name for name in environment if name not in own],
                    call=SETTINGS_RESETS,
                )


def _start(config: StackConfig, tmp: Path, exits: ExitStack) -> Running:
    if config.upstream:
        stack, upstream = exits.enter_context(stack_with_upstream(tmp, **config.stack_args()))
        return Running(config, stack, upstream, exits)
    return Running(config, exits.enter_context(LocalStack(port=0, **config.stack_args())), None, exits)


# Configurations shared by several modules (a module's own configuration lives in the module).
# The template as it is, IAM enforced as on AWS (whatever BATCHINFER_LOCAL_IAM says).
DEFAULT = StackConfig("default", iam=True)
# The embedded model and `scripted-model` on a holdable upstream.
UPSTREAM = StackConfig("upstream", upstream=True, iam=True)
# One request a shard (each request commits on its own), live counts every 0.2 s: cancel and partial
# results; each module sets its own CANCEL_GRACE_SECONDS (`SharedStacks.lease`).
ONE_LINE_SHARDS = StackConfig(
    "one-line-shards",
    upstream=True,
    parameter_overrides={"ShardSize": "1", "RemoteShardSize": "1"},
    function_environment={"PROGRESS_SECONDS": "0.2"},
)
