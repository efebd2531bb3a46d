"""The NumPy family: ``.npy`` files memory-mapped, ``.npz`` members loaded or streamed, arrays
in memory; each through :class:`arrayfeed.testing.SourceTests`, written as NumPy writes them and
opened through the public entry points.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._storage import (
    GatherInto,
    Source,
    as_source,
    open_for_copy,
    row_nbytes,
)
from arrayfeed._storage.npy.files import NpySource, NpzMemberSource
from arrayfeed._storage.npy.memory import ArraySource
from arrayfeed.testing import SourceTests

# -- the Source contract -------------------------------------------------------------------------


class TestArraySource(SourceTests):
    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        source = as_source(data, "x")  # the caller's own array, not a copy
        assert type(source) is ArraySource
        return source


class TestFortranArraySource(SourceTests):
    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        source = as_source(np.asfortranarray(data), "x")
        assert type(source) is ArraySource
        return source


class TestRawMemmap(SourceTests):
    """A headerless file written and mapped with ``np.memmap``."""

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        path = tmp_path / "data.bin"
        mm = np.memmap(path, dtype=data.dtype, mode="w+", shape=data.shape)
        mm[...] = data
        mm.flush()
        del mm
        source = as_source(np.memmap(path, dtype=data.dtype, mode="r", shape=data.shape), "x")
        assert type(source) is ArraySource
        return source


class TestNpyMemmap(SourceTests):
    """A ``.npy`` file the caller mapped with ``np.load(mmap_mode="r")``."""

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        np.save(tmp_path / "data.npy", data)
        source = as_source(np.load(tmp_path / "data.npy", mmap_mode="r"), "x")
        assert type(source) is ArraySource
        return source


class TestNpySource(SourceTests):
    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        np.save(tmp_path / "data.npy", data)
        source = af.open_array(tmp_path / "data.npy")
        assert type(source) is NpySource
        return source


class TestNpySourceLargeRows(SourceTests):
    """Rows of 4096 bytes or more: ``gather_into`` copies them with pread (native byte order)."""

    dtypes = ("uint8", "float32", "complex64", "bool", ">f8")
    row_shapes = ((64, 64), (4096,))
    n_rows = 48

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        np.save(tmp_path / "data.npy", data)
        source = af.open_array(tmp_path / "data.npy")
        assert type(source) is NpySource
        assert row_nbytes(source.shape, source.dtype) >= 4096
        return source


class TestFortranNpySource(SourceTests):
    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        np.save(tmp_path / "data.npy", np.asfortranarray(data))
        source = af.open_array(tmp_path / "data.npy")
        assert type(source) is NpySource
        return source


class TestNpzLoaded(SourceTests):
    """An ``.npz`` member through ``open_array``: loaded whole into memory."""

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        np.savez_compressed(tmp_path / "data.npz", x=data, other=np.zeros(3))
        source = af.open_array(tmp_path / "data.npz", key="x")
        assert type(source) is ArraySource
        return source


class TestNpzStreamed(SourceTests):
    """An ``.npz`` member streamed row by row (conversion): no gather, sorted reads only."""

    compressed: ClassVar[bool] = False
    fortran: ClassVar[bool] = False

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        save = np.savez_compressed if self.compressed else np.savez
        save(
            tmp_path / "data.npz",
            other=np.zeros(3),
            x=np.asfortranarray(data) if self.fortran else data,
        )
        source = open_for_copy(tmp_path / "data.npz", "x")
        assert type(source) is NpzMemberSource
        assert not isinstance(source, GatherInto)
        return source


class TestNpzStreamedCompressed(TestNpzStreamed):
    compressed = True


class TestNpzStreamedFortran(TestNpzStreamed):
    fortran = True


# -- memory maps and archives -------------------------------------------------------------------


@pytest.mark.parametrize("order", ["C", "F"])
def test_large_rows_gathered_from_the_map_in_any_order(tmp_path: Path, order: str) -> None:
    a = np.random.default_rng(0).integers(
        0, 255, size=(50, 40, 40, 3), dtype=np.uint8
    )  # 4.8 KB rows
    np.save(tmp_path / "big.npy", np.asarray(a, order=order))
    src = af.open_array(tmp_path / "big.npy")
    for idx in ([3, 4, 5, 6, 40, 2, 2, 49, 0], list(range(50)), [49]):
        out = np.empty((len(idx), 40, 40, 3), np.uint8)
        src.gather_into(np.array(idx, dtype=np.int64), out)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(out, a[idx])


def test_file_truncated_while_reading_large_rows_is_named(tmp_path: Path) -> None:
    np.save(tmp_path / "big.npy", np.zeros((50, 8192), np.uint8))
    src = af.open_array(tmp_path / "big.npy")
    with open(tmp_path / "big.npy", "r+b") as f:
        f.truncate(os.path.getsize(tmp_path / "big.npy") - 3 * 8192)
    out = np.empty((2, 8192), np.uint8)
    with pytest.raises(af.CorruptDataError, match=r"big\.npy' ended at byte .* truncated"):
        src.gather_into(np.array([1, 48], dtype=np.int64), out)  # type: ignore[attr-defined]


def test_gather_fills_any_output(tmp_path: Path) -> None:
    a = np.random.default_rng(2).integers(0, 255, size=(30, 5000), dtype=np.uint8)
    np.save(tmp_path / "big.npy", a)
    src = af.open_array(tmp_path / "big.npy")
    idx = np.array([4, 5, 6, 7, 20, 3], dtype=np.int64)
    out = np.empty((6, 5000), np.uint8)
    src.gather_into(idx, out)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(out, a[idx])
    # Strided and empty outputs are filled too, never silently skipped.
    strided = np.zeros((12, 5000), np.uint8)[::2]
    src.gather_into(idx, strided)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(strided, a[idx])
    src.gather_into(np.array([], dtype=np.int64), np.empty((0, 5000), np.uint8))  # type: ignore[attr-defined]


def test_concurrent_first_reads_open_one_file_descriptor(tmp_path: Path) -> None:
    import threading

    import psutil

    np.save(tmp_path / "big.npy", np.zeros((40, 5000), np.uint8))
    proc = psutil.Process()
    for _ in range(20):
        src = af.open_array(tmp_path / "big.npy")
        before = proc.num_fds()
        barrier = threading.Barrier(6)

        def read(src: object = src, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            src._file()  # type: ignore[attr-defined]

        threads = [threading.Thread(target=read) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert proc.num_fds() == before + 1
        del src, read, threads
        assert proc.num_fds() == before


def test_npy_is_memory_mapped_not_loaded(tmp_path: Path) -> None:
    np.save(tmp_path / "big.npy", np.zeros((1000, 100), np.float32))
    src = af.open_array(tmp_path / "big.npy")
    assert isinstance(src, NpySource)
    assert isinstance(src.array, np.memmap)
    assert not src.array.flags.writeable


def test_open_array_npz(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=np.arange(5), y=np.ones(5))
    assert af.open_array(tmp_path / "a.npz", key="x").read(
        np.array([4], dtype=np.int64)
    ).tolist() == [4]
    with pytest.raises(af.SourceNotFoundError, match="holds"):
        af.open_array(tmp_path / "a.npz", key="z")


def test_truncated_and_corrupt_npy_name_the_file(tmp_path: Path) -> None:
    np.save(tmp_path / "t.npy", np.arange(1000, dtype=np.float64))
    data = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[:-100])
    with pytest.raises(af.CorruptDataError, match=r"t\.npy' is truncated"):
        af.open_array(tmp_path / "t.npy")
    (tmp_path / "c.npy").write_bytes(b"\x93NUMPY\x01\x00garbage garbage")
    with pytest.raises(af.CorruptDataError, match=r"c\.npy' is not a readable"):
        af.open_array(tmp_path / "c.npy")
