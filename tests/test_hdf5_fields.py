"""Fields of compound (table) datasets, as PyTables, pandas and old AnnData write them: one field
streamed at a time, sub-array fields shaped right."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import arrayfeed as af

from .conftest import subprocess_env

N = 300
TABLE = np.dtype([("label", "<i4"), ("pos", ">f4", (3,)), ("w", "<f8"), ("flag", "?")])


@pytest.fixture
def table(tmp_path: Path) -> tuple[Path, np.ndarray]:
    rows = np.zeros(N, TABLE)
    rng = np.random.default_rng(0)
    rows["label"] = rng.integers(0, 10, N)
    rows["pos"] = rng.standard_normal((N, 3))
    rows["w"] = rng.random(N)
    rows["flag"] = rng.random(N) > 0.5
    path = tmp_path / "table.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/table", data=rows, chunks=(64,), compression="gzip", shuffle=True)
        f["plain"] = np.arange(N)
    return path, rows


@pytest.mark.parametrize("field", ["label", "pos", "w", "flag"])
def test_one_field_reads_as_its_own_array(table: tuple[Path, np.ndarray], field: str) -> None:
    path, rows = table
    source = af.open_array(path, "data/table", field=field)
    expected = rows[field]
    assert source.shape == expected.shape and source.dtype == expected.dtype
    idx = np.array([0, 3, 64, 65, 299], dtype=np.int64)
    np.testing.assert_array_equal(source.read(idx), expected[idx])
    spec = af.open_array(f"{path}:data/table#{field}")
    np.testing.assert_array_equal(spec.read(np.arange(N, dtype=np.int64)), expected)


def test_fields_train_as_inputs_and_targets(table: tuple[Path, np.ndarray]) -> None:
    path, rows = table
    x = af.open_array(path, "data/table", field="pos")
    y = af.open_array(path, "data/table", field="label")
    seen = []
    for xb, yb in af.batches(x, y, batch_size=50, seed=0):
        assert xb.shape[1:] == (3,) and xb.dtype == np.float32  # native byte order
        seen.append(yb)
    assert sorted(np.concatenate(seen).tolist()) == sorted(rows["label"].tolist())
    stream = next(iter(af.batches(x, y, batch_size=N, shuffle=False)))
    np.testing.assert_array_equal(stream[0], rows["pos"])
    np.testing.assert_array_equal(stream[1], rows["label"])


def test_a_field_converts_through_the_command_line(
    table: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    path, rows = table
    out = tmp_path / "out.zarr"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "arrayfeed",
            "convert",
            f"x={path}:data/table#pos",
            f"y={path}:data/table#label",
            "-o",
            str(out),
            "-q",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(af.open_array(out, "x").read(np.arange(N)), rows["pos"])
    np.testing.assert_array_equal(af.open_array(out, "y").read(np.arange(N)), rows["label"])


def test_field_errors_name_the_fix(table: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    path, _ = table
    with pytest.raises(
        af.SourceNotFoundError, match=r"no field 'nope'.*\['label', 'pos', 'w', 'flag'\]"
    ):
        af.open_array(path, "data/table", field="nope")
    with pytest.raises(af.SourceNotFoundError, match=r"not a compound dataset"):
        af.open_array(path, "plain", field="x")
    with pytest.raises(af.DtypeError, match=r"field='name'.*#name"):
        af.batches(af.open_array(path, "data/table"), batch_size=10)
    np.save(tmp_path / "a.npy", np.zeros(4))
    with pytest.raises(af.ConfigError, match=r"not an HDF5 file"):
        af.open_array(tmp_path / "a.npy", field="x")
