"""The simulated prefix-caching server of `make bench`'s prefix section (benchmarks/prefix_server.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]


def load_prefix_server() -> ModuleType:
    """benchmarks/prefix_server.py as a module (benchmarks/ is not a package on the tests' path)."""
    spec = importlib.util.spec_from_file_location(
        "bench_prefix_server", ROOT / "benchmarks" / "prefix_server.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prefix_server = load_prefix_server()


def test_grouping_sharers_sends_the_server_at_least_2x_fewer_uncached_tokens() -> None:
    # Given 32 lines of 4 interleaved system prompts (about 600 words each), a server caching 2
    result = prefix_server.measure(n=32, base_s=0.0, per_token_s=0.0)

    # Then in input order every line misses (4 prompts cycle through an LRU of 2); grouped, the first
    # line of each prompt in a block of 16 misses, the others hit
    assert result["input"]["prompt"] == result["grouped"]["prompt"] == 19_584
    assert result["input"]["uncached"] == 19_584
    assert result["grouped"]["uncached"] == 5_136
    assert result["ratio"] >= 2
