"""The Zarr family's sources: v3 and v2 stores with every codec, sharded, in memory, and those
``convert`` writes, each through :class:`arrayfeed.testing.SourceTests`; the completeness marker
and strict stores. Chunk reads in detail: ``test_zarr_chunks.py`` and ``test_zarr_buffers.py``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, ClassVar

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
from arrayfeed._storage import (
    Source,
    as_source,
)
from arrayfeed._storage.zarr.source import ZarrSource
from arrayfeed._storage.zarr.strict import StrictStore, zarr_marked_complete
from arrayfeed.testing import SourceTests, assert_same_rows

from ._shapes import _halves

# -- the Source contract -------------------------------------------------------------------------


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


class TestConvertedZarr(SourceTests):
    """A Zarr group written by ``arrayfeed convert``: marked complete, so read strictly."""

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        path = tmp_path / "data.zarr"
        af.convert({"x": data}, path, chunk_rows=16, compression="gzip", progress=False)
        source = af.open_array(path, key="x")
        assert type(source) is ZarrSource and source.strict and source.chunk_reader is not None
        return source


# -- stores written complete --------------------------------------------------------------------


def test_marker_detection(tmp_path: Path) -> None:
    root = zarr.open_group(tmp_path / "m.zarr", mode="w")
    plain = root.create_array("plain", shape=(4,), dtype="i4")
    assert not zarr_marked_complete(plain)
    plain.attrs["arrayfeed"] = {"complete": False}
    assert not zarr_marked_complete(plain)
    plain.attrs["arrayfeed"] = {"complete": True}
    assert zarr_marked_complete(plain)
    root.attrs["arrayfeed"] = {"complete": True}
    deep = root.create_group("a").create_group("b").create_array("x", shape=(4,), dtype="i4")
    assert zarr_marked_complete(deep)
    assert zarr_marked_complete(zarr.open_array(tmp_path / "m.zarr" / "a" / "b" / "x", mode="r"))
    lone = zarr.create_array(tmp_path / "lone.zarr", shape=(4,), dtype="i4")
    assert not zarr_marked_complete(lone)


def test_strict_zarr_source_pickles_and_stays_strict(tmp_path: Path) -> None:
    z = zarr.create_array(tmp_path / "s.zarr", shape=(10,), dtype="f8", chunks=(5,))
    z[...] = np.arange(10.0) + 1
    (tmp_path / "s.zarr" / "c" / "1").unlink()
    source = af.open_array(tmp_path / "s.zarr", strict=True)
    assert isinstance(source, ZarrSource) and isinstance(source.array.store, StrictStore)
    clone = pickle.loads(pickle.dumps(source))
    with pytest.raises(af.CorruptDataError, match=r"chunk \(1,\) \(key 'c/1'\)"):
        clone.read(np.array([7], dtype=np.int64))
    np.testing.assert_array_equal(clone.read(np.arange(5, dtype=np.int64)), np.arange(5.0) + 1)
    lenient = af.open_array(tmp_path / "s.zarr")
    np.testing.assert_array_equal(lenient.read(np.array([7], dtype=np.int64)), [0.0])
