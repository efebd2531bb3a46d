"""The HDF5 family's sources: contiguous datasets memory-mapped, chunked ones read as raw chunks or
through h5py, each through :class:`arrayfeed.testing.SourceTests`; pickling, fingerprints,
filters and read errors named. Raw chunks in detail: ``test_hdf5_chunks.py`` and beside it.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, ClassVar

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._storage import (
    Source,
    array_keys,
    as_source,
    describe,
)
from arrayfeed._storage.hdf5.files import check_filters as check_h5_filters
from arrayfeed._storage.hdf5.source import H5ContiguousSource, H5Source
from arrayfeed.storage import written_by_arrayfeed
from arrayfeed.testing import SourceTests

from ._shapes import _halves

# -- the Source contract -------------------------------------------------------------------------


class H5Tests(SourceTests):
    """One dataset written with h5py; subclasses choose its layout and filters."""

    backend: ClassVar[type] = H5Source
    #: Chunked (else contiguous), chunks splitting each row in two, and rows per chunk.
    chunked: ClassVar[bool] = True
    split_rows: ClassVar[bool] = False
    chunk_len: ClassVar[int] = 16
    options: ClassVar[dict[str, Any]] = {}
    #: Pass the caller's ``h5py.Dataset`` to ``as_source`` instead of a path to ``open_array``.
    via_dataset: ClassVar[bool] = False
    #: Unlimited ``maxshape`` (chunks may then hold more rows than the dataset has).
    resizable: ClassVar[bool] = False

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        path = tmp_path / "data.h5"
        options = dict(self.options)
        if self.chunked:
            rows = _halves(data.shape[1:]) if self.split_rows else data.shape[1:]
            options["chunks"] = (self.chunk_len, *rows)
        if self.resizable:
            options["maxshape"] = (None,) * data.ndim
        with h5py.File(path, "w") as f:
            f.create_dataset("group/x", data=data, **options)
        if self.via_dataset:
            source = as_source(h5py.File(path, "r")["group/x"], "x")
        else:
            source = af.open_array(path, key="group/x")
        assert type(source) is self.backend
        return source


class TestH5Contiguous(H5Tests):
    backend = H5ContiguousSource
    chunked = False


class TestH5ContiguousDataset(H5Tests):
    backend = H5ContiguousSource
    chunked = False
    via_dataset = True


class TestH5Chunked(H5Tests):
    split_rows = True


class TestH5ChunkedDataset(H5Tests):
    via_dataset = True


class TestH5GzipShuffle(H5Tests):
    options: ClassVar[dict[str, Any]] = {
        "compression": "gzip",
        "compression_opts": 4,
        "shuffle": True,
    }


class TestH5Lzf(H5Tests):
    options: ClassVar[dict[str, Any]] = {"compression": "lzf"}
    via_dataset = True


class TestH5Fletcher32(H5Tests):
    options: ClassVar[dict[str, Any]] = {"fletcher32": True}
    split_rows = True


class TestH5ResizableLargeChunks(H5Tests):
    """A resizable dataset whose chunks hold more rows than it has."""

    chunk_len = 512
    resizable = True


class TestConvertedHdf5(SourceTests):
    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        path = tmp_path / "data.h5"
        af.convert({"x": data}, path, chunk_rows=16, compression="lzf", progress=False)
        source = af.open_array(path, key="x")
        assert type(source) is H5Source
        return source


class TestH5CompoundField(SourceTests):
    """One field of a compound (table) dataset, as PyTables or pandas write tables: the rows of
    ``data`` are a (sub-array) field beside another one, chunked and compressed."""

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        table = np.dtype([("other", "<i2"), ("x", data.dtype, data.shape[1:])])
        rows = np.zeros(len(data), table)
        rows["x"] = data
        rows["other"] = np.arange(len(data)) % 7
        path = tmp_path / "table.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("t", data=rows, chunks=(16,), compression="gzip")
        source = af.open_array(f"{path}:t#x")
        assert type(source) is H5Source and source.field == "x"  # type: ignore[attr-defined]
        return source


# -- memory maps, pieces, pickling, integrity --------------------------------------------------


@pytest.mark.parametrize("userblock", [0, 512])
def test_contiguous_hdf5_is_memory_mapped(tmp_path: Path, userblock: int) -> None:
    a = np.arange(60, dtype=">f8").reshape(20, 3)
    with h5py.File(tmp_path / "c.h5", "w", userblock_size=userblock) as f:
        f["x"] = a
        f.create_dataset("chunked", data=a, chunks=(5, 3))
        f.create_dataset("gzip", data=a, compression="gzip")
        f.create_dataset("unwritten", shape=(20, 3), dtype="f8")
    with h5py.File(tmp_path / "c.h5", "r") as f:
        src = as_source(f["x"], "x")
        assert isinstance(src, H5ContiguousSource) and isinstance(src.array, np.memmap)
        np.testing.assert_array_equal(src.read(np.array([0, 7, 19], dtype=np.int64)), a[[0, 7, 19]])
        for name in ("chunked", "gzip", "unwritten"):
            assert isinstance(as_source(f[name], name), H5Source), name
    assert isinstance(af.open_array(tmp_path / "c.h5", key="x"), H5ContiguousSource)
    # A file opened for writing may still change under us: read through h5py then.
    with h5py.File(tmp_path / "c.h5", "r+") as f:
        assert isinstance(as_source(f["x"], "x"), H5Source)


def test_h5_reads_long_index_lists_in_pieces(tmp_path: Path) -> None:
    a = np.arange(3000 * 2).reshape(3000, 2)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("a", data=a, chunks=(100, 2))
    src = as_source(h5py.File(tmp_path / "a.h5", "r")["a"], "x")
    idx = np.unique(np.random.default_rng(0).integers(0, 3000, 1500)).astype(np.int64)
    idx = np.concatenate([idx[idx < 1000], np.arange(1000, 1600), idx[idx >= 1600]])
    np.testing.assert_array_equal(src.read(np.unique(idx)), a[np.unique(idx)])


def test_h5_source_reopens_by_path_after_pickle(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("a", data=np.arange(10), chunks=(4,))
    src = as_source(h5py.File(tmp_path / "a.h5", "r")["a"], "x")
    assert isinstance(src, H5Source)
    state = src.__getstate__()
    assert state["_dataset"] is None  # the handle is never pickled, only the path
    assert pickle.loads(pickle.dumps(src)).read(np.array([3], dtype=np.int64)).tolist() == [3]


def test_h5_fingerprint_is_of_the_open_file_not_the_path(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.arange(4)
    handle = h5py.File(tmp_path / "a.h5", "r")
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["x"] = np.arange(4) * 2
    os.replace(tmp_path / "b.h5", tmp_path / "a.h5")  # before the source is even created
    source = H5Source(handle["x"])
    with pytest.raises(af.CorruptDataError, match="replaced by another file"):
        source.verify()


def test_h5_filter_check_accepts_builtin_filters(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "a.h5", "w") as f:
        d = f.create_dataset("x", data=np.arange(100), chunks=(10,), compression="gzip")
        check_h5_filters(d, "a.h5:/x")


def test_an_hdf5_read_error_through_h5py_names_file_dataset_and_chunk(tmp_path: Path) -> None:
    """Datasets read through h5py (here: a writable handle, which the raw-chunk reader leaves
    to h5py) turn h5py's bare OSError into a CorruptDataError naming what failed."""
    path = tmp_path / "g.h5"
    data = np.random.default_rng(0).integers(0, 1000, (4000, 16)).astype(np.int32)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(500, 16), compression="gzip")
    with h5py.File(path, "r") as f:
        info = f["x"].id.get_chunk_info(3)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 4)
        fh.write(b"\xff" * 64)
    f = h5py.File(path, "r+")
    try:
        source = H5Source(f["x"])
        assert source.read_path.startswith("h5py")
        with pytest.raises(
            af.CorruptDataError,
            match=r"rows 1500\.\.1999 \(row chunk 3\) of HDF5 dataset '.*g\.h5:/x'",
        ):
            source.read(np.arange(1500, 2000, dtype=np.int64))
        out = np.empty((1000, 16), np.int32)
        with pytest.raises(af.CorruptDataError, match=r"row chunks 2\.\.3"):
            source.read_range_into(1000, 2000, out)
        np.testing.assert_array_equal(source.read(np.arange(0, 500, dtype=np.int64)), data[:500])
    finally:
        f.close()


def test_a_file_named_like_hdf5_that_is_not_is_named_everywhere_alike(tmp_path: Path) -> None:
    """The HDF5 backend claims ``.h5`` files by name: listing and describing one that is not
    HDF5 fail as opening it does, naming the file."""
    (tmp_path / "junk.h5").write_text("junk")
    for call in (af.open_array, describe, array_keys):
        with pytest.raises(af.CorruptDataError, match=r"cannot open HDF5 file '.*junk\.h5'"):
            call(tmp_path / "junk.h5")
    assert written_by_arrayfeed(tmp_path / "junk.h5") is None
