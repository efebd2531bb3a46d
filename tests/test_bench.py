"""`arrayfeed.bench`: measures the user's arrays and gives advice that follows from the figures."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._bench import BenchReport, _advise, arrays_at
from arrayfeed._storage.npy.memory import ArraySource


def test_bench_measures_every_mode(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((4000, 8), np.float32))
    report = af.bench({"x": str(tmp_path / "x.npy")}, batch_size=64, seconds=0.2)
    assert set(report.modes) == {"full", "block", "none"}
    assert all(rate > 0 for rate in report.modes.values())
    assert report.rows == 4000 and report.row_bytes == 32 and report.ceiling is None
    text = report.format()
    assert "batches(shuffle='block')" in text and "4,000 rows of 32 bytes" in text
    # How each pass read: the groups read at once, what bound them, and the data wait.
    assert set(report.tuning) == set(report.modes)
    assert all(t.tuned and t.threads >= 1 for t in report.tuning.values())
    assert len(re.findall(r"\d  threads \d+", text)) == 3, text
    assert all(t.data_wait is not None for t in report.tuning.values())
    assert len(re.findall(r"waiting for data \d+%", text)) == 3, text
    unsettled = [mode for mode, t in report.tuning.items() if not t.settled]
    assert text.count("tuning had not settled") == (1 if unsettled else 0), text


def test_bench_reads_epoch_after_epoch_for_its_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epoch of 20,000 small rows takes milliseconds: timed alone, it would time start-up,
    and the tuner would measure nothing. The bench reads for its seconds, epoch after epoch."""
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.MAX_GROUP_BYTES", 16 << 10)
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 16 << 10)  # 20 groups an epoch
    np.save(tmp_path / "x.npy", np.arange(20_000 * 4, dtype=np.float32).reshape(-1, 4))
    report = af.bench({"x": str(tmp_path / "x.npy")}, batch_size=64, seconds=2, modes=("full",))
    tuned = report.tuning["full"]
    assert tuned.rates, tuned  # windows were measured: epochs were read for the seconds


def test_bench_spots_chunks_that_split_rows(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset(
            "x", data=np.zeros((3000, 16), np.float32), chunks=(500, 4), compression="lzf"
        )
        f.create_dataset("y", data=np.zeros(3000, np.int32), chunks=(500,))
    with h5py.File(tmp_path / "a.h5", "r") as f:
        report = af.bench(
            {"x": f["x"], "y": f["y"]}, batch_size=64, seconds=0.2, modes=("full", "block")
        )
    assert report.ceiling is not None and report.ceiling > 0
    assert report.chunk_rows == {"x": 500, "y": 500}
    assert any(
        "chunks of x split rows" in line and "arrayfeed convert x=PATH y=PATH" in line
        for line in report.advice
    )


def _report(full: float, block: float, ceiling: float | None = None) -> BenchReport:
    return BenchReport(
        rows=10, row_bytes=4, batch_size=2, modes={"full": full, "block": block}, ceiling=ceiling
    )


def test_advice_follows_the_figures() -> None:
    src = {"x": ArraySource(np.zeros(10))}
    assert "use it" in _advise(_report(100.0, 400.0), src)[0]
    assert "about as fast" in _advise(_report(100.0, 110.0), src)[0]
    assert "2.0x faster than 'block'" in _advise(_report(200.0, 100.0), src)[0]
    slow = _advise(_report(100.0, 110.0, ceiling=1000.0), src)
    assert any("far below the storage's own slab speed" in line for line in slow)


def test_cli_bench_on_a_whole_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    from .conftest import subprocess_env

    with h5py.File(tmp_path / "t.h5", "w") as f:
        f.create_dataset(
            "x", data=np.zeros((3000, 16), np.float32), chunks=(500, 4), compression="lzf"
        )
        f["y"] = np.arange(3000)
    np.save(tmp_path / "w.npy", np.ones(3000))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "arrayfeed",
            "bench",
            str(tmp_path / "t.h5"),
            f"w={tmp_path / 'w.npy'}",
            "--seconds",
            "0.2",
            "--batch-size",
            "64",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "3,000 rows of 80 bytes, batch 64" in done.stdout
    assert "storage ceiling" in done.stdout
    assert "arrayfeed convert w=PATH x=PATH y=PATH" in done.stdout
    assert "threads " in done.stdout and "waiting for data" in done.stdout


def test_arrays_at_errors(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(3))
    with pytest.raises(af.ConfigError, match="two arrays are called 'a'"):
        arrays_at([str(tmp_path / "a.npy"), f"a={tmp_path / 'a.npy'}"])
    with pytest.raises(af.SourceNotFoundError):
        arrays_at([str(tmp_path / "missing.npy")])


def test_bench_on_fewer_rows_than_a_batch_is_an_error() -> None:
    with pytest.raises(af.ConfigError, match="too few rows for one batch"):
        af.bench({"x": np.zeros((10, 2), np.float32)}, batch_size=256, seconds=0.1)


def test_bench_takes_paths_as_the_command_line_does(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "raw.h5", "w") as f:
        f.create_dataset("group/x", data=np.zeros((3000, 16), np.float32), chunks=(500, 16))
        f["y"] = np.arange(3000)
    af.convert({"x": np.zeros((3000, 2), np.float32)}, tmp_path / "c.zarr", progress=False)
    one = af.bench(f"{tmp_path}/raw.h5:group/x", batch_size=64, seconds=0.05, modes=("full",))
    assert (one.rows, one.row_bytes, one.chunk_rows) == (3000, 64, {"group/x": 500})
    both = af.bench([f"{tmp_path}/raw.h5:y", f"x={tmp_path}/c.zarr:x"], batch_size=64, seconds=0.05)
    assert both.row_bytes == 16 and set(both.chunk_rows) == {"x", "y"}
    with pytest.raises(af.SourceNotFoundError, match=r"its arrays are \['x'\]"):
        af.bench(f"{tmp_path}/c.zarr:nope")
    whole = af.bench(tmp_path / "raw.h5", batch_size=64, seconds=0.05, modes=("full",))
    assert set(whole.chunk_rows) == {"group/x", "y"}


def test_arrays_at_takes_a_path_with_a_colon_as_written(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "t.h5:y", "w") as f:  # no t.h5 beside it
        f["x"] = np.zeros((10, 3))
        f["z"] = np.zeros(10)
    assert sorted(arrays_at([str(tmp_path / "t.h5:y")])) == ["x", "z"]
