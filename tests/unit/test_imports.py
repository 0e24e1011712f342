"""The layer package's imports point one way: no cycles, and no layer imports one above it.

Every import counts: top-level, function-level (lazy) and `if TYPE_CHECKING:` ones, since each is
a dependency a reader and a refactoring must respect. Layers, lowest first: core < wire < data <
backends < infer < endpoints < validation < pipeline < api; a module may import its own subpackage and
lower ones. An endpoint says how a backend serves it (so it stands above backends and infer), and
validation checks a line against its endpoint (so it stands above endpoints).
"""

from __future__ import annotations

import ast
from pathlib import Path

import batchinfer

PACKAGE = "batchinfer"
ROOT = Path(batchinfer.__file__).parent
LAYERS = ["core", "wire", "data", "backends", "infer", "endpoints", "validation", "pipeline", "api"]


def _module_name(path: Path) -> str:
    parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `module` imports anywhere in its source (`from a import b` counts
    as importing `a.b` when that is a module, else `a`)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        else:
            continue
        found.update(name for name in names if name in known and name != module)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imported(name, path, known) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, iterative)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return [*path[path.index(child) :], child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph[child])))
    return None


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_graph_sees_every_layer_and_function_level_imports() -> None:
    graph = _graph()

    assert {name.split(".")[1] for name in graph if "." in name} == set(LAYERS)
    # A function-level import (the registry builds backends lazily) is an edge too.
    assert "batchinfer.backends.llama_cpp" in graph["batchinfer.backends.registry"]


def test_cycle_finds_a_cycle_and_only_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_layer_package_has_no_import_cycle() -> None:
    cycle = _cycle(_graph())

    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_point_down_the_layers() -> None:
    upward = []
    for module, imports in sorted(_graph().items()):
        own = _layer(module)
        if own is None:
            continue
        for name in sorted(imports):
            layer = _layer(name)
            if layer is None or layer > own:
                upward.append(f"{module} imports {name}")

    assert upward == []


# Within backends/: base < config < http and llama_engine (what a backend runs on) < each backend <
# registry (limiter, limiter_rules and chaos stand beside).
BACKEND_ORDER = {
    "base": 0,
    "config": 1,
    "http": 2,
    "llama_engine": 2,
    "llama_cpp": 3,
    "openai_compat": 3,
    "kserve_v2": 3,
    "bedrock": 3,
    "registry": 4,
}


def test_backend_modules_import_down_their_order() -> None:
    def rank(module: str) -> int | None:
        prefix = "batchinfer.backends."
        return BACKEND_ORDER.get(module.removeprefix(prefix)) if module.startswith(prefix) else None

    upward = []
    for module, imports in sorted(_graph().items()):
        own = rank(module)
        for name in sorted(imports):
            other = rank(name)
            if own is not None and other is not None and other >= own:
                upward.append(f"{module} imports {name}")

    assert upward == []
