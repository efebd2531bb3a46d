"""Every source backend through the conformance suite of :mod:`arrayfeed.testing`.

Each class writes real files under ``tmp_path`` the way other tools write them (NumPy, h5py,
zarr-python, arrayfeed's own ``convert``) and opens them through the public entry points
(``arrayfeed.open_array``, ``arrayfeed._storage.as_source``), then checks that the source it got
is the backend it means to test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import h5py
import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    TransposeCodec,
    ZstdCodec,
)

import arrayfeed as af
from arrayfeed._pipeline.blocks import WindowCache
from arrayfeed._pipeline.plan import Plan
from arrayfeed._pipeline.resident import Resident
from arrayfeed._storage import GatherInto, Source, as_source, open_for_copy, row_nbytes
from arrayfeed._storage.hdf5.source import H5ContiguousSource, H5Source
from arrayfeed._storage.npy.files import NpySource, NpzMemberSource
from arrayfeed._storage.npy.memory import ArraySource
from arrayfeed._storage.zarr.source import ZarrSource
from arrayfeed.testing import SourceTests, assert_same_rows


def _halves(row_shape: tuple[int, ...]) -> tuple[int, ...]:
    """A chunk shape for one row that splits every axis in two (the last chunk partial when odd)."""
    return tuple(max(1, -(-n // 2)) for n in row_shape)


# -- in memory and memory-mapped ------------------------------------------------------------------
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


# -- .npy and .npz ---------------------------------------------------------------------------------
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


# -- HDF5 ------------------------------------------------------------------------------------------
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


# -- Zarr ------------------------------------------------------------------------------------------
#: dtypes of the arrays read through Zarr's own reads, which arrayfeed does not decode itself.
ZARR_READS_DTYPES = ("float64", ">f4", "complex64", "bool")


class ZarrTests(SourceTests):
    """One array written with zarr-python and opened with ``open_array``; subclasses choose its
    format, codecs and chunks, and whether arrayfeed's chunk reader takes it."""

    zarr_format: ClassVar[int] = 3
    compressors: ClassVar[Any] = None
    serializer: ClassVar[Any] = "auto"
    chunk_len: ClassVar[int] = 32
    split_rows: ClassVar[bool] = True
    shard_len: ClassVar[int | None] = None
    transpose: ClassVar[bool] = False
    #: Array path inside a group store (None: the store is the array).
    key: ClassVar[str | None] = None
    options: ClassVar[dict[str, Any]] = {}
    chunk_reader: ClassVar[bool] = True

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        path = tmp_path / "data.zarr"
        rows = _halves(data.shape[1:]) if self.split_rows else data.shape[1:]
        options: dict[str, Any] = dict(self.options, compressors=self.compressors)
        if self.serializer != "auto":
            options["serializer"] = self.serializer
        if self.shard_len is not None:
            options["shards"] = (self.shard_len, *data.shape[1:])
        if self.transpose:
            options["filters"] = [TransposeCodec(order=tuple(reversed(range(data.ndim))))]
        chunks = (self.chunk_len, *rows)
        if self.key is None:
            array = zarr.create_array(
                path,
                shape=data.shape,
                dtype=data.dtype,
                chunks=chunks,
                zarr_format=self.zarr_format,
                **options,
            )
        else:
            group = zarr.open_group(path, mode="w", zarr_format=self.zarr_format)
            array = group.create_array(
                self.key, shape=data.shape, dtype=data.dtype, chunks=chunks, **options
            )
        array[...] = data
        source = af.open_array(path, key=self.key)
        assert type(source) is ZarrSource
        assert (source.chunk_reader is not None) == self.chunk_reader, (
            "chunk reader not as expected"
        )
        return source

    def test_reads_match_zarrs_own(self, open_source: Any, row_shape: tuple[int, ...]) -> None:
        data = self.data(row_shape=row_shape)
        source = open_source(data)
        array = source.array  # the zarr.Array the source reads
        assert_same_rows(np.asarray(array[...]), data, "zarr's own read of the whole array")
        for name, idx in self.selections(source).items():
            theirs = np.asarray(array.oindex[idx]) if len(idx) else data[:0]
            assert_same_rows(source.read(idx), theirs, f"read({name}) against zarr's")


class TestZarrV3Uncompressed(ZarrTests):
    split_rows = False


class TestZarrV3Zstd(ZarrTests):
    compressors = (ZstdCodec(),)


class TestZarrV3Blosc(ZarrTests):
    compressors = (BloscCodec(),)
    key = "inner/x"


class TestZarrV3Gzip(ZarrTests):
    compressors = (GzipCodec(),)
    split_rows = False


class TestZarrV3Crc32c(ZarrTests):
    compressors = (Crc32cCodec(),)


class TestZarrV3ZstdCrc32cBigEndian(ZarrTests):
    compressors = (ZstdCodec(), Crc32cCodec())
    serializer = BytesCodec(endian="big")


class TestZarrV3OneLargeChunk(ZarrTests):
    """Chunks that hold more rows than the array has (every row in one chunk)."""

    compressors = (ZstdCodec(),)
    chunk_len = 512
    split_rows = False


class TestZarrV3Sharded(ZarrTests):
    dtypes = ZARR_READS_DTYPES
    compressors = (ZstdCodec(),)
    chunk_len = 8
    shard_len = 32
    split_rows = False
    chunk_reader = False


class TestZarrV3Transposed(ZarrTests):
    dtypes = ZARR_READS_DTYPES
    transpose = True
    chunk_reader = False


class TestZarrV2Uncompressed(ZarrTests):
    zarr_format = 2


class TestZarrV2Blosc(ZarrTests):
    zarr_format = 2
    compressors = numcodecs.Blosc()
    split_rows = False
    options: ClassVar[dict[str, Any]] = {"chunk_key_encoding": {"name": "v2", "separator": "/"}}


class TestZarrInMemory(SourceTests):
    """A ``zarr.Array`` in a ``MemoryStore``, read through Zarr."""

    dtypes = ZARR_READS_DTYPES

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        array = zarr.create_array(
            zarr.storage.MemoryStore(),
            shape=data.shape,
            dtype=data.dtype,
            chunks=(16, *data.shape[1:]),
        )
        array[...] = data
        source = as_source(array, "x")
        assert type(source) is ZarrSource and source.chunk_reader is None
        return source


# -- stores written by arrayfeed -----------------------------------------------------------------
class TestConvertedZarr(SourceTests):
    """A Zarr group written by ``arrayfeed convert``: marked complete, so read strictly."""

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        path = tmp_path / "data.zarr"
        af.convert({"x": data}, path, chunk_rows=16, compression="gzip", progress=False)
        source = af.open_array(path, key="x")
        assert type(source) is ZarrSource and source.strict and source.chunk_reader is not None
        return source


class TestConvertedHdf5(SourceTests):
    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        path = tmp_path / "data.h5"
        af.convert({"x": data}, path, chunk_rows=16, compression="lzf", progress=False)
        source = af.open_array(path, key="x")
        assert type(source) is H5Source
        return source


# -- wrappers --------------------------------------------------------------------------------------
class TestWindowCache(SourceTests):
    """A chunked HDF5 source behind the window cache of ``shuffle="block"``."""

    picklable = False
    not_picklable_because = "a WindowCache serves one epoch in one process (it holds a lock)"

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        with h5py.File(tmp_path / "data.h5", "w") as f:
            f.create_dataset("x", data=data, chunks=(16, *data.shape[1:]), compression="gzip")
        inner = af.open_array(tmp_path / "data.h5")
        assert type(inner) is H5Source
        plan = Plan(
            n_rows=len(inner),
            batch_size=10,
            shuffle="block",
            seed=1,
            block_rows=16,
            window_blocks=2,
        )
        return WindowCache(inner, plan.block_order(0), capacity=1)


class TestResident(SourceTests):
    """A small chunked HDF5 leaf held in memory by the feed (read whole on first use)."""

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        with h5py.File(tmp_path / "data.h5", "w") as f:
            f.create_dataset("x", data=data, chunks=(16, *data.shape[1:]), compression="gzip")
        inner = af.open_array(tmp_path / "data.h5")
        assert type(inner) is H5Source
        return Resident(inner)


def test_a_backend_must_implement_make_source() -> None:
    with pytest.raises(NotImplementedError, match="must implement `make_source`"):
        SourceTests().make_source(np.zeros(3), Path("."))


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
