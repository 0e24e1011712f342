"""The shapes bench's breakdown and medians (benchmarks/shapes.py), on made-up figures."""

from __future__ import annotations

from benchmarks import shapes

SERVER = {
    "first_at": 102.0,
    "last_at": 110.0,
    "refused_by_port": {"5001": 3, "5002": 4, "6001": 2, "7001": 1},
}


def test_the_breakdown_counts_seconds_from_create() -> None:
    # Given the invocations of one batch created at 100 (the aggregator's first look came before the
    # last answer and found work left)
    calls = shapes.Invocations()
    calls.calls += [
        ("PrepareFunction", 100.2, 101.0),
        ("ShardWorkerFunction", 101.1, 110.1),
        ("ShardWorkerFunction", 101.3, 109.0),
        ("AggregatorFunction", 109.5, 109.6),
        ("AggregatorFunction", 110.5, 111.0),
    ]

    # When the breakdown is taken at completed = 111.5
    phases = shapes.breakdown(calls, 100.0, 111.5, SERVER)

    # Then every phase is seconds from create, the aggregator's run the one after the last answer
    assert {k: round(v, 2) for k, v in phases.items()} == {
        "prepared": 1.0,
        "worker": 1.1,
        "first": 2.0,
        "last": 10.0,
        "aggregator": 10.5,
        "aggregated": 11.0,
        "completed": 11.5,
    }


def test_429s_are_summed_per_worker_process() -> None:
    # Given ports 5001 and 5002 of one process, 6001 of another, 7001 of none seen
    owners = {5001: 11, 5002: 11, 6001: 12}

    # Then each process's refusals, largest first, the unseen port alone
    assert shapes.refused_by_worker(SERVER, owners) == [7, 2, 1]


def test_the_summary_is_the_median_of_the_runs() -> None:
    # Given three runs of one shape
    shape = shapes.SHAPES[0]
    runs = [
        {"sdk_rps": sdk, "batch": {"rps": rps, "phases": {}, "refused": []}}
        for rps, sdk in [(90.0, 100.0), (99.0, 100.0), (80.0, 100.0)]
    ]

    # When summarised
    (row,) = shapes.summary({"shapes": {shape: runs}})

    # Then the medians, and the median run's breakdown
    assert (row["batch_rps"], row["sdk_rps"], row["ratio"], row["ratios"]) == (
        90.0,
        100.0,
        0.9,
        [0.9, 0.99, 0.8],
    )
    assert row["median_run"] is runs[0]
