"""One conformance class that every source backend runs, plus open_array and as_source."""

from __future__ import annotations

import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import arrayfeed as af
from arrayfeed._dtypes import check_feedable
from arrayfeed._pipeline.read.rows import read_rows
from arrayfeed._storage import GatherInto, Source, as_source
from arrayfeed._storage.npy.files import NpySource
from arrayfeed._storage.npy.memory import ArraySource
from arrayfeed._storage.zarr.source import ZarrSource

DTYPES = ["uint8", "int64", "float16", "float64", "bool", "complex64"]


def _data(dtype: str, n: int = 23) -> np.ndarray:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 100, size=(n, 3, 2))
    return (a % 2 == 0) if dtype == "bool" else a.astype(dtype)


class SourceConformance:
    """Subclasses implement ``make(tmp_path, array) -> Source``."""

    def make(self, tmp_path: Path, array: np.ndarray) -> Source:
        raise NotImplementedError

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_metadata(self, tmp_path: Path, dtype: str) -> None:
        a = _data(dtype)
        src = self.make(tmp_path, a)
        assert isinstance(src, Source)
        assert tuple(src.shape) == a.shape
        assert np.dtype(src.dtype) == a.dtype
        assert len(src) == len(a)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_read_sorted_unique(self, tmp_path: Path, dtype: str) -> None:
        a = _data(dtype)
        src = self.make(tmp_path, a)
        for idx in ([0], [22], [1, 2, 3, 4], [0, 5, 6, 21, 22], list(range(23))):
            got = src.read(np.array(idx, dtype=np.int64))
            np.testing.assert_array_equal(got, a[idx])
            assert got.shape == (len(idx), 3, 2)

    def test_read_returns_fresh_memory(self, tmp_path: Path) -> None:
        a = _data("float64")
        src = self.make(tmp_path, a)
        got = src.read(np.arange(2, 9, dtype=np.int64))
        got[...] = -1
        np.testing.assert_array_equal(src.read(np.arange(2, 9, dtype=np.int64)), a[2:9])

    def test_read_rows_any_order_with_duplicates(self, tmp_path: Path) -> None:
        # read_rows uses gather_into where a backend has it, else sorted unique reads.
        a = _data("int64")
        src = self.make(tmp_path, a)
        idx = np.array([9, 3, 3, 22, 0, 9], dtype=np.int64)
        (out,) = read_rows([src], idx)
        np.testing.assert_array_equal(out, a[idx])
        if isinstance(src, GatherInto):
            out2 = np.empty((6, 3, 2), dtype=np.int64)
            src.gather_into(idx, out2)
            np.testing.assert_array_equal(out2, a[idx])

    def test_pickle_round_trip(self, tmp_path: Path) -> None:
        a = _data("float64")
        src = self.make(tmp_path, a)
        clone = pickle.loads(pickle.dumps(src))
        np.testing.assert_array_equal(clone.read(np.array([1, 7], dtype=np.int64)), a[[1, 7]])


class TestArraySource(SourceConformance):
    def make(self, tmp_path: Path, array: np.ndarray) -> Source:
        return ArraySource(array.copy())


class TestMemmapSource(SourceConformance):
    def make(self, tmp_path: Path, array: np.ndarray) -> Source:
        np.save(tmp_path / "a.npy", array)
        return as_source(np.load(tmp_path / "a.npy", mmap_mode="r"), "x")


class TestNpySource(SourceConformance):
    def make(self, tmp_path: Path, array: np.ndarray) -> Source:
        np.save(tmp_path / "a.npy", array)
        return af.open_array(tmp_path / "a.npy")


class TestFortranNpySource(SourceConformance):
    def make(self, tmp_path: Path, array: np.ndarray) -> Source:
        np.save(tmp_path / "f.npy", np.asfortranarray(array))
        return af.open_array(tmp_path / "f.npy")


class TestH5ContiguousSource(SourceConformance):
    def make(self, tmp_path: Path, array: np.ndarray) -> Source:
        with h5py.File(tmp_path / "a.h5", "w") as f:
            f["data/a"] = array
        return af.open_array(tmp_path / "a.h5", key="data/a")


class TestH5ChunkedSource(SourceConformance):
    def make(self, tmp_path: Path, array: np.ndarray) -> Source:
        with h5py.File(tmp_path / "a.h5", "w") as f:
            f.create_dataset("a", data=array, chunks=(4, 3, 2), compression="gzip")
        return as_source(h5py.File(tmp_path / "a.h5", "r")["a"], "x")


class TestZarrSource(SourceConformance):
    def make(self, tmp_path: Path, array: np.ndarray) -> Source:
        z = zarr.create_array(
            tmp_path / "a.zarr", shape=array.shape, dtype=array.dtype, chunks=(5, 3, 2)
        )
        z[...] = array
        return af.open_array(tmp_path / "a.zarr")


class TestZarrGroupSource(SourceConformance):
    def make(self, tmp_path: Path, array: np.ndarray) -> Source:
        g = zarr.open_group(tmp_path / "g.zarr", mode="w")
        z = g.create_array("inner/a", shape=array.shape, dtype=array.dtype, chunks=(4, 3, 2))
        z[...] = array
        return af.open_array(tmp_path / "g.zarr", key="inner/a")


def test_as_source_kinds(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(4))
    z = zarr.create_array(tmp_path / "z.zarr", shape=(4,), dtype="i4")
    assert isinstance(as_source(np.arange(3), "x"), ArraySource)
    assert isinstance(as_source(str(tmp_path / "a.npy"), "x"), NpySource)
    assert isinstance(as_source(tmp_path / "a.npy", "x"), NpySource)
    assert isinstance(as_source(z, "x"), ZarrSource)
    src = as_source(np.arange(3), "x")
    assert as_source(src, "x") is src


def test_open_array_errors(tmp_path: Path) -> None:
    with pytest.raises(af.SourceNotFoundError, match="nothing at"):
        af.open_array(tmp_path / "missing.npy")
    with h5py.File(tmp_path / "two.h5", "w") as f:
        f["a"], f["b"] = np.arange(3), np.arange(3)
    with pytest.raises(af.SourceNotFoundError, match=r"datasets are \['a', 'b'\]"):
        af.open_array(tmp_path / "two.h5")
    with pytest.raises(FileNotFoundError, match="no dataset 'c'"):
        af.open_array(tmp_path / "two.h5", key="c")
    g = zarr.open_group(tmp_path / "g.zarr", mode="w")
    g.create_array("p", shape=(3,), dtype="i4")
    g.create_array("q", shape=(3,), dtype="i4")
    with pytest.raises(af.SourceNotFoundError, match="pass one of them as `key`"):
        af.open_array(tmp_path / "g.zarr")
    with pytest.raises(af.SourceNotFoundError, match="no array 'r'"):
        af.open_array(tmp_path / "g.zarr", key="r")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(af.SourceNotFoundError, match=r"not a \.npy"):
        af.open_array(tmp_path / "notes.txt")
    np.save(tmp_path / "one.npy", np.arange(3))
    with pytest.raises(af.SourceNotFoundError, match="drop `key`"):
        af.open_array(tmp_path / "one.npy", key="x")


@pytest.mark.parametrize(
    ("array", "error", "match"),
    [
        (np.array([object(), 1], dtype=object), af.DtypeError, "dtype object"),
        (np.zeros(3, dtype=[("a", "i4"), ("b", "f4")]), af.DtypeError, "structured"),
        (np.array(["a", "b"]), af.DtypeError, "does not feed"),
        (np.zeros(3, dtype=np.longdouble), af.DtypeError, "cannot represent"),
        (np.array(3.0), af.ShapeError, "0-d"),
        (np.zeros((0, 3)), af.ShapeError, "empty"),
    ],
)
def test_check_feedable(array: np.ndarray, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_feedable(ArraySource(array), "x['a']")


@pytest.mark.parametrize("suffix", [".h5", ".h5ad", ".nc"])
def test_file_key_paths_work_wherever_a_path_does(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"data{suffix}"
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    with h5py.File(path, "w") as f:
        f["X"] = x
        f["obs/idx"] = np.arange(20)
    assert af.open_array(f"{path}:X").shape == (20, 2)
    assert af.open_array(f"{path}:obs/idx").shape == (20,)
    batch = next(iter(af.batches(f"{path}:X", f"{path}:obs/idx", batch_size=20, shuffle=False)))
    np.testing.assert_array_equal(batch[0], x)
    from arrayfeed._bench import arrays_at

    assert sorted(arrays_at([f"{path}:X"])) == ["X"]
    with pytest.raises(af.SourceNotFoundError, match=r"holds 2 datasets.*:KEY' as a path"):
        af.open_array(path)
    with pytest.raises(af.SourceNotFoundError, match=r"has no dataset 'nope'"):
        af.open_array(f"{path}:nope")
    with pytest.raises(af.SourceNotFoundError, match="nothing at"):
        af.open_array(f"{tmp_path / 'absent'}{suffix}:X")
