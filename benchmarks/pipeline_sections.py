"""`make bench`'s sections on the pipeline's own steps (benchmarks/run.py runs them): prepare's
validation and sharding, the aggregation of results and a backlog of many accounts' batches. Each
adds its rows (`Row`) and notes to the run's report."""

from __future__ import annotations

from benchmarks.common import Row


def prepare(rows: list[Row], notes: list[str]) -> None:
    """Prepare's lines per second against `json.loads` alone, and its memory on a large file."""
    from benchmarks import prepare_bench as bench

    speed = bench.throughput(n=50_000, rounds=5)  # a full batch under the default limits
    ratio = speed["ours"] / speed["raw"]
    rows.append(
        Row(
            f"prepare: validation + sharding ({speed['line_bytes']}-byte lines)",
            f"{speed['ours']:,.0f} lines/s",
            f"{speed['raw']:,.0f} lines/s (json.loads)",
            ratio,
            ">= 0.5",
            ratio >= 0.5,
        )
    )
    peaks = bench.peak_rss()
    base = peaks[10_000]["peak_mib"]
    for n, peak in peaks.items():
        growth = peak["peak_mib"] / base
        rows.append(
            Row(
                f"prepare: peak RSS, {n:,} lines ({peak['file_mib']:.0f} MiB file)",
                f"{peak['peak_mib']:.1f} MiB",
                f"{base:.1f} MiB (10k lines)",
                growth,
                "<= 1.10" if n > 10_000 else "",
                growth <= 1.10 if n > 10_000 else None,
            )
        )
    notes.append(
        "prepare RSS: "
        + ", ".join(
            f"{n:,} lines in {p['seconds']:.1f} s (imports {p['imports_mib']:.0f} MiB)"
            for n, p in peaks.items()
        )
    )


def aggregation(rows: list[Row], notes: list[str]) -> None:
    """The aggregator's MiB per second of results written against one S3 copy of the same bytes."""
    from benchmarks import aggregation as bench

    result = bench.measure(50_000)  # a batch at the default limit of requests
    ratio = result["ours"] / result["raw"]
    rows.append(
        Row(
            f"aggregation: {result['requests']:,} results in {result['shards']} shards "
            f"({result['mib']:.0f} MiB)",
            f"{result['ours']:.1f} MiB/s",
            f"{result['raw']:.1f} MiB/s (S3 copy)",
            ratio,
            "",
            None,
        )
    )


def backlog(rows: list[Row], notes: list[str]) -> None:
    """A big account's backlog beside small accounts' batches: lost, duplicated and unrun lines, and
    how long the small ones waited."""
    from benchmarks import backlog as bench

    r = bench.measure()
    counts = (r["lost"], r["duplicated"], r["unreached"])
    rows.append(
        Row(
            f"backlog: {r['batches']} batches of 4 accounts + {r['probes']} probes ({r['lines']:,} lines), "
            f"refusing C={r['capacity']} L={r['latency']:g} s, every fault at {r['rate']:g}: lines lost / "
            "duplicated / failed without reaching the model",
            " / ".join(str(n) for n in counts),
            "",
            None,
            "0 / 0 / 0",
            counts == (0, 0, 0),
        )
    )
    fewest = min(r["fired"], key=r["fired"].get)
    rows.append(
        Row(
            "backlog: the fault fired least",
            f"{r['fired'][fewest]} ({fewest})",
            "",
            None,
            f">= {bench.MIN_FIRED}",
            r["fired"][fewest] >= bench.MIN_FIRED,
        )
    )
    rows.append(
        Row(
            "backlog: the other accounts' last batch ended vs the big batch (s from the submit)",
            f"{r['others_end']:.0f} s",
            f"{r['big_end']:.0f} s",
            r["others_end"] / r["big_end"],
            "< 1",
            r["others_end"] < r["big_end"],
        )
    )
    notes.append("backlog: " + "; ".join(" ".join(line.split()) for line in bench.report(r)))
