"""The scaling benchmark runs end to end in its smallest configuration (no speed is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import REPO_ROOT, run_benchmark


def test_smallest_configuration_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    scratch = tmp_path / "tmp"  # where the benchmark makes (and must remove) its data
    done = run_benchmark(
        "bench_scaling.py",
        [
            "--quick",
            "--cases",
            "npy,gather,busy",
            "--levels",
            "feed",
            "--rows-scale",
            "0.003",
            "--seconds",
            "0.05",
            "--reps",
            "2",
            "--json",
            str(out),
        ],
        scratch,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "feed level" in done.stdout and "Targets" in done.stdout

    report = json.loads(out.read_text())
    assert {"machine", "config", "figures", "rates", "targets", "skipped"} <= set(report)
    assert {"cores", "cpu", "python", "numpy", "h5py", "zarr", "tensorflow"} <= set(
        report["machine"]
    )
    threads = report["config"]["threads"]
    assert threads[0] == 1 and threads[-1] == report["machine"]["cores"]
    figures = report["figures"]
    expected = {
        (shape, case, str(t))
        for shape in ("S", "L")
        for case in (".npy path (full)", "NumPy gather (memmap)", "NumPy gather (RAM)")
        for t in threads
    } | {(shape, ".npy path (full)", "default") for shape in ("S", "L")}
    assert expected <= {(f["shape"], f["case"], f["threads"]) for f in figures}
    for figure in figures:
        assert figure["level"] == "feed"
        assert len(figure["samples"]) == 2 and all(rate > 0 for rate in figure["samples"])
        assert figure["median"] > 0
    npy = [f for f in figures if f["case"] == ".npy path (full)"]
    assert all(f["storage"] == "npy" and f["resolved_threads"] >= 1 for f in npy)
    assert report["rates"]["feed"]["L"]["NumPy gather (memmap)"]["1"] > 0
    assert any(t["name"].startswith("L .npy path, feed") for t in report["targets"])
    assert not any(scratch.iterdir())


def test_the_hand_off_count_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "handoffs.json"
    scratch = tmp_path / "tmp"
    done = run_benchmark(
        "bench_handoffs.py",
        [
            "--shapes",
            "L",
            "--cases",
            "npy,zarrconv",
            "--rows-scale",
            "0.01",
            "--reps",
            "1",
            "--groups",
            "1",
            "--json",
            str(out),
        ],
        scratch,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "GIL hand-offs" in done.stdout
    report = json.loads(out.read_text())
    assert set(report) == {
        "L plan of an epoch, full shuffle",
        "L plan of an epoch, block",
        "L group of the feed, .npy path (full)",
        "L group of the feed, Zarr by convert (block)",
    }
    for row in report.values():
        assert set(row) == {"quiet", "busy 5 ms", "busy 1 ms", "hand-offs"}
        assert all(value >= 0 for value in row.values()) and row["quiet"] > 0
    assert not any(scratch.iterdir())  # the data went with its temporary directory


def test_warm_runs_time_the_tuned_default_and_report_its_choice(tmp_path: Path) -> None:
    out = tmp_path / "warm.json"
    done = run_benchmark(
        "bench_scaling.py",
        [
            "--cases",
            "npy",
            "--levels",
            "feed",
            "--shapes",
            "S",
            "--rows-scale",
            "0.01",
            "--seconds",
            "0.05",
            "--warm",
            "0.4",
            "--warm-fixed",
            "0.05",
            "--threads",
            "1,2",
            "--reps",
            "1",
            "--verbose",
            "--json",
            str(out),
        ],
        tmp_path / "tmp",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["config"]["threads"] == [1, 2]
    assert (report["config"]["warm"], report["config"]["warm_fixed"]) == (0.4, 0.05)
    default = next(f for f in report["figures"] if f["threads"] == "default")
    # One timed run (no untimed warm-up pass when runs warm themselves): the tuner's choice of it.
    assert len(default["tuned_threads"]) == len(default["history"]) == 1
    assert default["history"][0][-1] == default["tuned_threads"][0]
    assert "S .npy path (full) T=default:" in done.stderr  # --verbose: every run's rows/s
    assert "default threads, as tuned" in done.stdout


def test_the_groups_benchmark_reports_the_groups_of_feeds_built_one_after_another(
    tmp_path: Path,
) -> None:
    out = tmp_path / "groups.json"
    done = run_benchmark(
        "bench_groups.py",
        [
            "--cases",
            "h5gzip",
            "--shape",
            "S",
            "--variants",
            "2,default",
            "--rows-scale",
            "0.02",
            "--seconds",
            "0.2",
            "--json",
            str(out),
        ],
        tmp_path / "tmp",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "batches per group" in done.stdout
    runs = json.loads(out.read_text())["runs"]
    assert [r["variant"] for r in runs] == ["2", "default"]
    assert all(r["group_steps"] >= 1 and r["rows_per_s"] > 0 for r in runs)
    assert runs[1]["windows"] and not runs[0]["windows"]


def test_autotune_counts_a_run_that_never_settled_as_the_slowest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
    from bench_autotune import slowest

    assert slowest([3.5, 2.0]) == 3.5
    assert slowest([None, 3.5]) == float("inf")  # a miss, not 3.5
