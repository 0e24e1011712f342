"""`make bench`'s report and its results files (benchmarks/run.py), on a small made-up result set."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]


def load_run() -> ModuleType:
    """benchmarks/run.py as a module (it puts the repository on sys.path for `benchmarks.common`)."""
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = load_run()
WHEN = datetime(2026, 12, 3, 17, 5, tzinfo=UTC)


def fake_report() -> str:
    rows = [
        run.Row(
            "prepare: validation + sharding", "10 lines/s", "20 lines/s (json.loads)", 0.5, ">= 0.5", True
        ),
        run.Row("aggregation: 1 result", "1.0 MiB/s", "2.0 MiB/s (S3 copy)", 0.5, "", None),
    ]
    return run.report(rows, ["", "| service | operation |\n|---|---|\n| s3 | PutObject |"], ["prepare: fast"])


def test_the_report_holds_the_ratio_table_the_section_tables_and_the_notes() -> None:
    # Given two rows, one section table (the other section not run) and a note
    # When the report is built
    text = fake_report()

    # Then
    assert text == (
        "| figure | batchinfer | reference (same run) | ratio | target | met |\n"
        "|---|---|---|---|---|---|\n"
        "| prepare: validation + sharding | 10 lines/s | 20 lines/s (json.loads) | 0.500 | >= 0.5 | yes |\n"
        "| aggregation: 1 result | 1.0 MiB/s | 2.0 MiB/s (S3 copy) | 0.500 |  |  |\n"
        "\n"
        "| service | operation |\n|---|---|\n| s3 | PutObject |\n"
        "\n"
        "- prepare: fast\n"
    )


def test_a_full_run_writes_latest_and_a_dated_copy(tmp_path: Path) -> None:
    # Given the report of a run of every section
    body = fake_report()

    # When it is written
    written = run.write_results(
        body,
        sections=list(run.SECTIONS),
        seconds=61.4,
        when=WHEN,
        directory=tmp_path / "results",
        commit="abc1234",
        machine="2 CPUs, load average 0.5 at the start.",
    )

    # Then both files hold the same text: a title, what ran, and the report
    dated, latest = tmp_path / "results" / "2026-12-03-1705-make-bench.md", tmp_path / "results" / "latest.md"
    assert written == [dated, latest]
    expected = (
        "# `make bench`, 2026-12-03 17:05 UTC\n\n"
        "11 sections (grid, shapes, saturation, embedded, embeddings, prefix, shared_prefix, prepare, "
        "aggregation, backlog, aws) in 61 s; commit "
        "`abc1234`. 2 CPUs, load average 0.5 at the start.\n\n" + body
    )
    assert dated.read_text() == expected
    assert latest.read_text() == expected


def test_a_partial_run_writes_only_its_dated_copy(tmp_path: Path) -> None:
    # Given a latest.md from an earlier full run
    (tmp_path / "latest.md").write_text("the full run\n")

    # When an --only run's report is written
    written = run.write_results(
        fake_report(), sections=["prepare", "aggregation"], seconds=3.0, when=WHEN, directory=tmp_path
    )

    # Then it is a dated file named by its sections; latest.md still holds the full run
    assert written == [tmp_path / "2026-12-03-1705-make-bench-prepare-aggregation.md"]
    title = "# `make bench`, 2026-12-03 17:05 UTC\n\n"
    assert written[
        0
    ].read_text() == title + "2 sections (prepare, aggregation) in 3 s; commit `unknown`.\n\n" + (
        fake_report()
    )
    assert (tmp_path / "latest.md").read_text() == "the full run\n"
