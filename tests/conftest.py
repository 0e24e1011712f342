"""The suite's order, its xdist groups and the shared local stacks' lifetime (support/stacks.py).

- The modules of one stack configuration (`pytest.mark.stack`) run one after another, where the
  first of them was collected; each configuration is one xdist group (`--dist loadgroup`: one worker
  runs all its tests and builds its stack once), every heavy configuration one group together (the
  model in many environments: never two at once on this machine's cores).
- The other end-to-end and the integration modules each make a group of their own: what a module
  starts once (a stack, a model server) is started by one worker only. Unit tests go one by one.
- Before a test that uses no shared stack, the shared one stops (one stack per process; in-process
  moto needs the process's environment back).

Groups are marks added here, at collection, before xdist reads them (`tryfirst`), and named in the
nodeid as xdist's loadgroup means to: pytest-xdist 3.8.0 appends `@group` to `item._nodeid`, which
pytest 9 no longer reads (`Node.nodeid` is `str(item._id)`), so without the rename here every test
would be scheduled on its own, a module's and a configuration's tests spread over both workers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _pytest.nodeid import NodeId

from support.stacks import SharedStacks

HEAVY_GROUP = "heavy-model"
# Test directories whose modules start things once for their tests (stacks, servers): a group per module.
MODULE_GROUP_DIRS = ("tests/e2e/", "tests/integration/")

STACKS = SharedStacks()


@pytest.fixture(scope="session")
def shared_stacks() -> Iterator[SharedStacks]:
    """The process's shared local stack (support/stacks.py), stopped at the end of the session."""
    yield STACKS
    STACKS.close()


def _group(item: pytest.Item) -> str | None:
    """The item's xdist group: its stack configuration's (heavy ones share one), its module's in
    `MODULE_GROUP_DIRS`, else none (scheduled test by test)."""
    mark = item.get_closest_marker("stack")
    if mark is not None:
        return HEAVY_GROUP if mark.kwargs.get("heavy") else f"stack-{mark.args[0]}"
    path = item.nodeid.split("::")[0]
    return path if path.startswith(MODULE_GROUP_DIRS) else None


def _order_key(item: pytest.Item) -> str:
    mark = item.get_closest_marker("stack")
    return f"stack-{mark.args[0]}" if mark is not None else item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(_order_key(item), index)
    items.sort(key=lambda item: first[_order_key(item)])  # stable: modules keep their tests' order
    for item in items:
        group = _group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            # An xdist worker of `--dist loadgroup` (its own `dist` is "no")
            if getattr(config.option, "loadgroup", False) and "@" not in item.nodeid.rpartition("]")[2]:
                item._id = NodeId.parse(f"{item.nodeid}@{group}")  # xdist's scope: the part after "@"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if "shared_stacks" not in item.fixturenames:
        STACKS.close()
