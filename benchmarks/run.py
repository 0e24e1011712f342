"""`make bench`: batchinfer against the limits it runs into, each measured side by side in one run.

Prints one table of ratios (the machine is noisy: only figures measured together are compared),
then the AWS calls per 1,000 requests by operation and the cost per million requests. Sections:

0. the grid (benchmarks/grid.py): whole batches through the local stack against refusing, queueing and
   tokens-per-minute servers x C x L, vs the `openai` SDK told C and vs C/L, with each cell's cost;
   shapes (benchmarks/shapes.py): three servers a batch must serve as fast as the SDK loop (median of
   3 runs), each batch's time from create to `completed` by phase, 429s per worker; a 20,000-request
   batch vs C/L;
1. backend saturation: the shard worker vs C/L of a simulated backend, and a plain asyncio client;
2. embedded model: a 32-request batch through the local stack vs the single-sequence path and the
   raw batched-decode ceiling (benchmarks/ceiling.py);
3. prepare: validation + sharding vs raw `json.loads`; peak RSS at 10k, 100k and 1M lines;
4. aggregation: merging shard results vs a raw S3 copy of the same bytes;
   prefix (benchmarks/prefix_server.py): a simulated prefix-caching server, the worker grouping a
   batch's sharers of a system prompt vs launching in input order (uncached prompt tokens);
   shared_prefix (benchmarks/shared_prefix.py): a 32-request batch sharing a ~675-token system prompt
   through the local stack on the embedded model vs the same batch made unshareable, and its cached
   tokens vs the tokens a prefix computed once skips;
5. backlog (benchmarks/backlog.py): 4 accounts' 12 batches against a server far smaller than the
   demand, every fault at 2%: nothing lost, duplicated or failed unrun, small accounts first;
6. AWS calls per 1,000 requests, and cost per million requests.

    .venv/bin/python benchmarks/run.py                 # everything (about 35 minutes on 2 cores)
    .venv/bin/python benchmarks/run.py --only prepare,aggregation

The report is printed and written to benchmarks/results/: a dated copy of every run
(`<date>-<time>-make-bench.md`, `...-make-bench-<sections>.md` for an `--only` run) and, for a run of
every section, `latest.md`, which docs/performance.md links.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/run.py` from the repo

from benchmarks.common import HEADER, Row, markdown_table
from benchmarks.pipeline_sections import aggregation, backlog, prepare

SECTIONS = (
    "grid",
    "shapes",
    "saturation",
    "embedded",
    "embeddings",
    "prefix",
    "shared_prefix",
    "prepare",
    "aggregation",
    "backlog",
    "aws",
)
RESULTS = Path(__file__).resolve().parent / "results"
LATENCY_S, CAPACITY = 0.5, 48  # the simulated backend of the saturation section


def _say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def grid(rows: list[Row], notes: list[str]) -> str:
    from benchmarks import grid as bench

    result = bench.measure(say=_say)
    cells = result["rows"]
    met = sum(r["met"] for r in cells)
    rows.append(
        Row(
            f"grid: cells at >= 0.95 of the SDK told C and >= 0.90 of C/L ({len(cells)} cells, "
            f"{result['seconds']:.0f} s)",
            f"{met} of {len(cells)}",
            "",
            None,
            f"{len(cells)} of {len(cells)}",
            met == len(cells),
        )
    )
    for r in cells:
        rows.append(
            Row(
                f"grid: {r['kind']} C={r['C'] or r['told']} L={r['L']:g} s, {r['n']:,} requests vs the SDK",
                f"{r['batch_rps']:.1f} req/s",
                f"{r['sdk_rps']:.1f} req/s (C/L {r['ideal']:.0f})",
                r["vs_sdk"],
                ">= 0.95, >= 0.90 of C/L",
                r["met"],
            )
        )
    queueing = [r for r in cells if r["kind"] == "queueing"]
    settled = [r for r in queueing if r["settled_queue"] <= max(1, 0.1 * r["C"])]
    if queueing:
        rows.append(
            Row(
                "grid: queueing servers, settled queue (50-90% served) within 10% of C (1 at C = 8)",
                f"{len(settled)} of {len(queueing)}",
                "",
                None,
                f"{len(queueing)} of {len(queueing)}",
                len(settled) == len(queueing),
            )
        )
    by_c = {r["C"]: r for r in cells if r["kind"] == "refusing" and r["L"] == 1.0}
    if 8 in by_c and 512 in by_c:
        small, large = by_c[8]["rss_peak_mib"], by_c[512]["rss_peak_mib"]
        rows.append(
            Row(
                "grid: shard worker RSS at 512 in flight (refusing C=512, L=1) vs at 8",
                f"{large:.0f} MiB",
                f"{small:.0f} MiB",
                large / small if small else None,
                "<= 1.10",
                bool(small) and large / small <= 1.10,
            )
        )
    sdk_cpu = ", ".join(f"{r['sdk_cpu_ms']:.1f}" for r in cells)
    notes.append(
        f"grid: load average before each cell {', '.join(f'{x:.1f}' for x in result['loads'])} "
        f"({os.cpu_count()} CPUs); a 1-request batch takes {result['overhead_s']:.2f} s from create to "
        f"completed (in every cell's time); SDK CPU per request "
        f"{sdk_cpu} ms"
    )
    return bench.table(cells)


def saturation(rows: list[Row], notes: list[str]) -> dict[str, Any]:
    from benchmarks import saturation as bench

    result = bench.measure(n=2000, latency=LATENCY_S, capacity=CAPACITY, rounds=5)
    limit, worker, plain = result["limit"], result["worker"], result["plain"]
    rows.append(
        Row(
            f"backend saturation: shard worker, {result['n']:,}-request batch x "
            f"{len(result['worker_runs'])}, C={result['capacity']}, "
            f"L={result['latency']:g} s, ceiling {result['ceiling']}",
            f"{worker.rate():.1f} req/s",
            f"C/L = {limit:.0f} req/s",
            worker.rate() / limit,
            ">= 0.95",
            worker.rate() / limit >= 0.95,
        )
    )
    rows.append(
        Row(
            "backend saturation: plain asyncio + httpx, told C",
            f"{plain.rate():.1f} req/s",
            f"C/L = {limit:.0f} req/s",
            plain.rate() / limit,
            "",
            None,
        )
    )
    rows.append(
        Row(
            "backend saturation: shard worker vs plain client",
            f"{worker.rate():.1f} req/s",
            f"{plain.rate():.1f} req/s",
            worker.rate() / plain.rate(),
            ">= 1.0 (not below)",
            worker.rate() >= plain.rate(),
        )
    )
    rounds = len(result["worker_runs"])
    notes.append(
        f"saturation ({rounds} alternating runs each, summed): worker {worker.ok} ok / {worker.failed} "
        f"failed, {worker.refused / rounds:.0f} answers 429 per run (found C by itself), peak "
        f"{worker.peak} in flight at the backend; plain client {plain.ok} ok / {plain.failed} failed; "
        f"runs {', '.join(f'{r.seconds:.2f}' for r in result['worker_runs'])} s (worker) and "
        f"{', '.join(f'{r.seconds:.2f}' for r in result['plain_runs'])} s (plain); worker CPU "
        f"{result['worker_cpu_ms_per_request']:.2f} ms per request"
    )
    return result


def embedded(rows: list[Row], notes: list[str]) -> None:
    from benchmarks import embedded as bench

    result = bench.measure(rounds=3)  # the machine drifts over minutes: alternate
    single, ceiling = result["stack"] / result["direct"], result["stack"] / result["ceiling"]
    figure = f"embedded model: {result['n']}-request batch end to end through the local stack"
    rows.append(
        Row(
            f"{figure} vs the single-sequence path",
            f"{result['stack']:.1f} tok/s",
            f"{result['direct']:.1f} tok/s (Llama loop)",
            single,
            ">= 2.5",
            single >= 2.5,
        )
    )
    rows.append(
        Row(
            f"{figure} vs the raw batched decode of {result['ceiling_seqs']} sequences",
            f"{result['stack']:.1f} tok/s",
            f"{result['ceiling']:.1f} tok/s (ceiling.py)",
            ceiling,
            ">= 0.75",
            ceiling >= 0.75,
        )
    )
    notes.append(
        f"embedded ({result['threads']} threads; load average before each round "
        f"{', '.join(f'{x:.1f}' for x in result['loads'])}): {result['stack_tokens']} completion tokens per "
        f"batch, {result['stack_seconds']:.1f} s through the stack; stack runs "
        f"{', '.join(f'{r:.1f}' for r in result['stack_runs'])} tok/s, single path runs "
        f"{', '.join(f'{r:.1f}' for r in result['direct_runs'])} tok/s ({result['direct_tokens']} tokens), "
        f"ceiling runs (end to end / decode / one sequence's decode) "
        f"{', '.join('/'.join(f'{x:.0f}' for x in r) for r in result['ceiling_runs'])} tok/s"
    )


def embeddings(rows: list[Row], notes: list[str]) -> None:
    from benchmarks import embeddings as bench

    result = bench.measure(rounds=2)
    ratio = result["stack"] / result["raw"]
    rows.append(
        Row(
            f"embeddings: {result['n']}-input /v1/embeddings batch end to end through the local stack "
            "vs the raw batched decode of the same model",
            f"{result['stack']:.1f} inputs/s",
            f"{result['raw']:.1f} inputs/s (engine decode calls)",
            ratio,
            ">= 0.75",
            ratio >= 0.75,
        )
    )
    notes.append(
        f"embeddings (load average before each round {', '.join(f'{x:.1f}' for x in result['loads'])}): "
        f"stack runs {', '.join(f'{r:.1f}' for r in result['stack_runs'])} inputs/s, raw runs "
        f"{', '.join(f'{r:.1f}' for r in result['raw_runs'])} inputs/s"
    )


def prefix(rows: list[Row], notes: list[str]) -> None:
    from benchmarks import prefix_server as bench

    result = bench.measure()
    grouped, plain = result["grouped"], result["input"]
    rows.append(
        Row(
            "prefix: uncached prompt tokens a prefix-caching server computes, 64 lines of 4 interleaved "
            "system prompts, the worker grouping sharers vs input order",
            f"{grouped['uncached']:,} tokens",
            f"{plain['uncached']:,} tokens (input order)",
            result["ratio"],
            ">= 2",
            result["ratio"] >= 2,
        )
    )
    notes.append(
        "prefix (simulated server, LRU of 2 prefixes, latency 2 ms + 0.02 ms per uncached token, "
        f"4 in flight): grouped {grouped['seconds']:.2f} s, input order {plain['seconds']:.2f} s"
    )


def shapes(rows: list[Row], notes: list[str]) -> str:
    from benchmarks import shapes as bench

    return bench.report(bench.measure(say=_say), rows, notes)


def shared_prefix(rows: list[Row], notes: list[str]) -> None:
    from benchmarks import shared_prefix as bench

    bench.report(bench.measure(), rows, notes)


def aws_calls(rows: list[Row], notes: list[str], worker_rate: float | None) -> str:
    from benchmarks import aws_calls as bench

    result = bench.measure(5000)
    per_thousand = {key: calls * 1000 / result["requests"] for key, calls in result["counts"].items()}
    total = sum(per_thousand.values())
    rows.append(
        Row(
            f"AWS calls per 1,000 requests ({result['requests']:,}-request batch, {result['shards']} shards)",
            f"{total:.1f}",
            "",
            None,
            "<= 40",
            total <= 40,
        )
    )
    calls = markdown_table(
        ["service", "operation", "calls per 1,000 requests"],
        [[s, o, f"{c:.2f}"] for (s, o), c in sorted(per_thousand.items(), key=lambda kv: -kv[1])],
    )
    backend = f"L = {LATENCY_S:g} s, {CAPACITY} in flight"
    if worker_rate:
        worker_ms, basis = 1000 / worker_rate, f"the saturation run: {backend}"
    else:
        worker_ms, basis = 1000 * LATENCY_S / CAPACITY, f"assumed: {backend}"
    # The same calls and time on arm64 (template parameter Architecture): only the GB-second price differs.
    x86, arm = (bench.cost_per_million(result, worker_ms, basis, arch) for arch in ("x86_64", "arm64"))
    cost = markdown_table(
        ["item", "$ per million requests, x86_64", "arm64", "basis"],
        [
            [item, f"{dollars:.2f}", f"{arm_dollars:.2f}", basis]
            for (item, dollars, basis), (_, arm_dollars, _) in zip(x86, arm, strict=True)
        ]
        + [
            [
                "**total, excluding the model**",
                f"**{sum(d for _, d, _ in x86):.2f}**",
                f"**{sum(d for _, d, _ in arm):.2f}**",
                "",
            ]
        ],
    )
    return f"{calls}\n\n{cost}"


def report(rows: list[Row], tables: list[str], notes: list[str]) -> str:
    """The run's Markdown report: the ratio table, the section tables (`tables`, empty ones skipped), the
    notes as a list."""
    parts = [markdown_table(HEADER, [row.cells() for row in rows]), *(t for t in tables if t)]
    if notes:
        parts.append("\n".join(f"- {note}" for note in notes))
    return "\n\n".join(parts) + "\n"


def _commit() -> str:
    """The checked-out commit (`git describe --always --dirty`), or "unknown" outside a git checkout."""
    try:
        found = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
            cwd=RESULTS,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return found.stdout.strip() or "unknown"


def write_results(
    body: str,
    *,
    sections: list[str],
    seconds: float,
    when: datetime,
    directory: Path = RESULTS,
    commit: str = "unknown",
    machine: str = "",
) -> list[Path]:
    """Write one run's report to `directory` (created if missing): a dated copy, and `latest.md` when
    `sections` is every section of `SECTIONS`. Returns the paths written, the dated copy first.

    `body`: the Markdown of `report`; `when`: the run's start (UTC; names the dated copy
    `YYYY-MM-DD-HHMM-make-bench.md`, with `-<sections>` for a partial run); `seconds`: its wall time;
    `machine`: a line on the machine (CPUs, load). Documentation links `latest.md`, so re-running the
    benchmarks never changes the documentation itself.
    """
    full = list(sections) == list(SECTIONS)
    suffix = "" if full else "-" + "-".join(sections)
    title = f"# `make bench`, {when:%Y-%m-%d %H:%M} UTC"
    done = f"{len(sections)} sections ({', '.join(sections)}) in {seconds:.0f} s; commit `{commit}`"
    text = "\n\n".join(filter(None, [title, f"{done}. {machine}".strip(), body.rstrip()])) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / f"{when:%Y-%m-%d-%H%M}-make-bench{suffix}.md"]
    if full:
        written.append(directory / "latest.md")
    for path in written:
        path.write_text(text, encoding="utf-8")
    return written


def _run_section(section: str, rows: list[Row], notes: list[str], worker_rate: float | None) -> Any:
    """Run one section, adding its rows and notes; returns its table, or the saturation result."""
    if section == "grid":
        return grid(rows, notes)
    if section == "shapes":
        return shapes(rows, notes)
    if section == "saturation":
        return saturation(rows, notes)
    if section == "aws":
        return aws_calls(rows, notes, worker_rate)
    {
        "embedded": embedded,
        "embeddings": embeddings,
        "prefix": prefix,
        "shared_prefix": shared_prefix,
        "prepare": prepare,
        "aggregation": aggregation,
        "backlog": backlog,
    }[section](rows, notes)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the report is written")
    args = parser.parse_args()
    chosen = [s for s in SECTIONS if s in args.only.split(",")]
    unknown = {s for s in args.only.split(",") if s} - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    rows: list[Row] = []
    notes: list[str] = []
    tables = {"grid": "", "shapes": "", "aws": ""}
    worker_rate = None
    when, started = datetime.now(UTC), time.monotonic()
    machine = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start."
    for section in chosen:
        _say(f"{section} ...")
        before = len(rows)
        try:
            result = _run_section(section, rows, notes, worker_rate)
            if section == "saturation":
                worker_rate = result["worker"].rate()
            elif section in tables:
                tables[section] = result
        except Exception as error:  # one broken section must not cost the others' figures
            logging.getLogger("bench").exception("section %s failed", section)
            rows.append(
                Row(f"{section}: failed ({type(error).__name__}: {error})"[:160], "", "", None, "", False)
            )
        for row in rows[before:]:
            _say(" | ".join(row.cells()))
    body = report(rows, [tables["grid"], tables["shapes"], tables["aws"]], notes)
    seconds = time.monotonic() - started
    print(body)
    print(f"{len(chosen)} sections in {seconds:.0f} s on {os.cpu_count()} CPUs")
    paths = write_results(
        body,
        sections=chosen,
        seconds=seconds,
        when=when,
        directory=args.results,
        commit=_commit(),
        machine=machine,
    )
    _say(f"wrote {', '.join(str(p) for p in paths)}")
    if any(row.met is False for row in rows):
        print("some targets were not met", file=sys.stderr)


if __name__ == "__main__":
    main()
